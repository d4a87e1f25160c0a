"""OpenEnv environments the tests start as servers (written with openenv-core's API, as ``openenv init``'s template)."""
