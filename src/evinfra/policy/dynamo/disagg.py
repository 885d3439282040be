"""Dynamo's conditional disaggregation, `isl_bounding` policy.

Source: Dynamo `docs/components/router/router-disaggregated-serving.md` ("Conditional
Disaggregation") and `lib/kv-router/src/conditional_disagg.rs` (`IslBoundingPolicy`). The
router first picks a (cache-hot) decode worker; the prefill runs locally on it when

    eff_isl = max(prompt_tokens - device_overlap_blocks_on_that_worker * block_size, 0)
    eff_isl < eff_isl_threshold  AND  eff_isl / max(prompt_tokens, 1) < eff_isl_ratio_threshold

and on a prefill worker otherwise. Defaults: 2048 tokens and 0.7.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class IslBounding:
    enabled: bool = True
    eff_isl_threshold_tokens: int = 2048
    eff_isl_ratio_threshold: float = 0.7

    def __post_init__(self) -> None:
        if self.eff_isl_threshold_tokens < 0:
            raise ValueError(f"eff_isl_threshold_tokens must be >= 0, got {self}")
        if not 0.0 <= self.eff_isl_ratio_threshold <= 1.0:
            raise ValueError(f"eff_isl_ratio_threshold must be in [0, 1], got {self}")

    def runs_locally(
        self, num_prompt_tokens: int, num_device_overlap_blocks: int, block_size: int
    ) -> bool:
        """True: prefill on the decode worker; False: on a prefill worker."""
        if not self.enabled:
            return False
        eff_isl = effective_isl(num_prompt_tokens, num_device_overlap_blocks, block_size)
        if eff_isl >= self.eff_isl_threshold_tokens:
            return False
        return eff_isl / max(num_prompt_tokens, 1) < self.eff_isl_ratio_threshold


def effective_isl(num_prompt_tokens: int, num_device_overlap_blocks: int, block_size: int) -> int:
    """New prompt tokens left to compute after the device prefix hit."""
    return max(num_prompt_tokens - num_device_overlap_blocks * block_size, 0)
