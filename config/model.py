"""model: the decoder's shape (conf/size/*.yaml)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from common.settings import require, setting

if TYPE_CHECKING:
    from config.run import JobConfig


@dataclass(frozen=True)
class ModelConfig:
    """The decoder's shape. `block_size` is the unit of depth a family works in: LIDAS grows by
    one block per stage, a looped model repeats one block."""
    name: str = setting()
    d_model: int = setting(gt=0)
    n_layers: int = setting(gt=0)
    n_heads: int = setting(gt=0)
    n_kv_heads: int = setting(gt=0)
    d_ff: int = setting(gt=0)
    vocab_size: int = setting(gt=0)
    max_seq_len: int = setting(gt=0)
    rope_theta: float = setting(gt=0)
    norm_eps: float = setting(gt=0)
    init_std: float = setting(gt=0)
    block_size: int = setting(gt=0)
    tie_embeddings: bool = setting()

    def check(self, run: JobConfig) -> None:
        require(self.d_model % self.n_heads == 0,
                f"model.n_heads={self.n_heads}: must divide model.d_model={self.d_model}")
        require(self.n_heads % self.n_kv_heads == 0,
                f"model.n_kv_heads={self.n_kv_heads}: must divide model.n_heads={self.n_heads}")
        require((self.d_model // self.n_heads) % 2 == 0,
                f"model.d_model/n_heads={self.d_model // self.n_heads}: RoPE needs an even head size")
