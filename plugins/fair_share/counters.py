"""The Virtual Token Counter (Sheng et al., "Fairness in Serving Large Language Models", OSDI 2024):
per tenant, the weighted tokens it has been served.

    service = input_weight * prompt tokens + output_weight * output tokens      (divided by the tenant's weight)

The scheduler admits from the backlogged tenant with the least counter. A tenant that becomes
backlogged again (it had nothing waiting) has its counter lifted to the least counter among the
tenants that are backlogged, so time spent idle is not banked as credit against them.

The paper's bound (its Theorem on VTC): two tenants backlogged over an interval receive services
that differ by at most 2 * U, where U = max(input_weight * L_input, output_weight * M): L_input the
longest prompt and M the most tokens one running batch holds.
"""
from __future__ import annotations

from collections.abc import Iterable


class VirtualTokenCounter:
    """Counters of weighted service per tenant. `input_weight` below `output_weight`: a prompt token
    costs less to serve than a generated one (the paper weights output tokens 2x)."""

    def __init__(self, input_weight: float = 1.0, output_weight: float = 2.0) -> None:
        if not (input_weight > 0 and output_weight > 0):
            raise ValueError(f"fair_share weights must be > 0, got input {input_weight}, output {output_weight}")
        self.input_weight, self.output_weight = input_weight, output_weight
        self.counters: dict[str, float] = {}

    def charge(self, tenant: str, weight: float, prompt_tokens: int = 0, output_tokens: int = 0) -> None:
        """Add the service of `prompt_tokens` and `output_tokens`, scaled down by the tenant's `weight`."""
        if prompt_tokens or output_tokens:
            cost = self.input_weight * prompt_tokens + self.output_weight * output_tokens
            self.counters[tenant] = self.counters.get(tenant, 0.0) + cost / weight

    def lift(self, tenant: str, backlogged: Iterable[str]) -> None:
        """`tenant` just became backlogged: raise its counter to the least of the other backlogged ones."""
        others = [self.counters.get(t, 0.0) for t in backlogged if t != tenant]
        if others:
            self.counters[tenant] = max(self.counters.get(tenant, 0.0), min(others))

    def __getitem__(self, tenant: str) -> float:
        return self.counters.get(tenant, 0.0)
