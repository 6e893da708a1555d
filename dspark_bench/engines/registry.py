"""What the engines lend a sweep priced on a serving engine's costs (`sweep --prices llamacpp`, or an
engine's cost-model file): per engine name, how its prices are measured and how the sweep's best
policies are confirmed in it. The search (`tuning`) asks for them here; a test may lend its own.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from dspark_bench.engines.llama_server import find_server
from dspark_bench.engines.llamacpp_confirm import confirm_in_llamacpp
from dspark_bench.engines.llamacpp_run import sweep_prices
from dspark_bench.errors import DsparkError
from dspark_bench.replay.cost_file import OURS


@dataclass
class EngineRegistry:
    """Per engine name: `measure(spec, pair, prompts, gamma, max_new_tokens, say, progress)`, its
    cost_file.CostFile where none is cached; `confirm(spec, prepared, record, prices, gamma, folder,
    say, progress)`, the best policies run in that engine and its verdict (a dict with a `sentence`)."""

    measure: dict[str, Callable] = field(default_factory=dict)
    confirm: dict[str, Callable] = field(default_factory=dict)


def engine_registry(prices: str | None, say: Callable[[str], None] | None = None) -> EngineRegistry:
    """The engines a sweep priced on `prices` (its --prices) measures and confirms in: llama.cpp's
    prices measured where none are cached, and its confirmation in llama-server where one is built
    here; where none is, a sweep priced on llama.cpp's costs is confirmed on our decoder alone, as said."""
    try:
        find_server(None)
    except DsparkError as error:  # ranked on llama.cpp's prices still; confirmed on ours alone
        if say and prices not in (None, "", OURS):
            say(f"no llama-server here ({error}): a sweep priced on llama.cpp's costs is confirmed on our decoder only")
        return EngineRegistry(measure={"llamacpp": sweep_prices})
    return EngineRegistry(measure={"llamacpp": sweep_prices}, confirm={"llamacpp": confirm_in_llamacpp})
