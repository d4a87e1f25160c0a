"""The per-episode tool server of vf-hint when its task config asks for one (``tools``): one MCP
tool, ``lookup_multiple``. With ``tools.url`` set, verifiers launches nothing and the seat's chat
program connects to that URL."""

import verifiers.v1 as vf


class LookupToolset(vf.Toolset[vf.ToolsetConfig]):
    TOOL_PREFIX = "lookup"

    @vf.tool
    async def multiple(self, a: int, b: int) -> int:
        """Multiply two integers."""
        return a * b


if __name__ == "__main__":
    LookupToolset.run()
