"""The calculator tool server of vf-calc: one MCP tool, ``calc_multiply``."""

import verifiers.v1 as vf


class CalcToolset(vf.Toolset[vf.SharedToolsetConfig]):
    TOOL_PREFIX = "calc"

    @vf.tool
    async def multiply(self, a: int, b: int) -> int:
        """Multiply two integers."""
        return a * b


if __name__ == "__main__":
    CalcToolset.run()
