"""The agent runtime: the app side of tool use. The model proposes calls; this code validates,
authorizes, executes (with timeouts and idempotency keys) and feeds results back, within a budget.

    from modelcall.plugins.agent import Agent, OpenAIChatClient, tool

    @tool
    def get_weather(city: str, unit: Literal["c", "f"] = "c") -> str:
        "Today's weather in a city."
        ...

    agent = Agent(OpenAIChatClient("http://127.0.0.1:8000"), [get_weather])
    result = await agent.run("Weather in Paris?")
"""
from modelcall.plugins.agent.client import KernelChatClient, ModelReply, OpenAIChatClient, RetryPolicy
from modelcall.plugins.agent.idempotency import IdempotencyStore, MemoryStore, SQLiteStore
from modelcall.plugins.agent.policy import Policy
from modelcall.plugins.agent.result import Budget, ModelRequestRecord, TaskResult, ToolOutcome
from modelcall.plugins.agent.runtime import Agent
from modelcall.plugins.agent.tools import Tool, tool

__all__ = [
    "Agent", "Budget", "IdempotencyStore", "KernelChatClient", "MemoryStore", "ModelReply", "ModelRequestRecord",
    "OpenAIChatClient", "Policy", "RetryPolicy", "SQLiteStore", "TaskResult", "Tool", "ToolOutcome", "tool",
]
