"""A coding environment for the sandbox tests: each step runs the action's code (openenv-core's
``MCPEnvironment.execute_code``, an ``exec``)."""
