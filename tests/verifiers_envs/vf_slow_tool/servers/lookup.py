"""The tool server of vf-slow-tool: one MCP tool, ``lookup_weather``, that never answers (a
tool backed by a service that hangs)."""

import asyncio

import verifiers.v1 as vf


class LookupToolset(vf.Toolset[vf.SharedToolsetConfig]):
    TOOL_PREFIX = "lookup"

    @vf.tool
    async def weather(self, city: str) -> str:
        """The weather in a city."""
        await asyncio.sleep(3600)
        return "sunny"


if __name__ == "__main__":
    LookupToolset.run()
