"""agent layer: the episode runner (multi-turn tool calling in a sandbox session), its tools,
policies (local model token-in/token-out, OpenAI-compatible endpoint, scripted), the context
policy and the acceptance run. RL rollouts and evaluation use this one runner."""

from tidal.agent.context import ContextPolicy
from tidal.agent.policy import OraclePolicy, Policy, ScriptedPolicy, Turn, make_policy
from tidal.agent.records import AgentOutcome, AgentResult, StepRecord, Termination
from tidal.agent.runner import AgentConfig, run_episode
from tidal.agent.toolcall import (
    CallValidity,
    ParsedTurn,
    ToolCall,
    format_tool_call,
    parse_tool_calls,
)
from tidal.agent.tools import ToolOutput, ToolSpec, tool, tool_schemas

__all__ = [
    "AgentConfig", "AgentOutcome", "AgentResult", "CallValidity", "ContextPolicy", "OraclePolicy", "ParsedTurn",
    "Policy", "ScriptedPolicy", "StepRecord", "Termination", "ToolCall", "ToolOutput", "ToolSpec", "Turn",
    "format_tool_call", "make_policy", "parse_tool_calls", "run_episode", "tool", "tool_schemas",
]
