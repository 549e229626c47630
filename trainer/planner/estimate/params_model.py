"""The parameter counts, written once (docs/formulas.md, Parameters): the whole model's, per token, and a rank's.

Each is an ``expr.Term``, as in ``step_model`` and ``memory_model``: ``params.count`` and ``params.rank_params``
compute with them from the counts of the tensors (``params.block_tensors``), ``explain`` prints their formulas.

Symbols: V vocabulary, h width, s sequence, E experts of an MoE layer, k of them a token; per_*_block the parameters
of one block, *_matmul those of its weight matrices; dense_block, moe_block, embedding, final (norm and head) the
shares of one rank.
"""
from __future__ import annotations

from trainer.planner.estimate.expr import Term, symbols

(n_layers, n_dense, n_moe, per_dense, per_moe, embedding, final_norm, head) = symbols(
    "n_layers n_dense_layers n_moe_layers per_dense_block per_moe_block embedding final_layernorm head")
(V, h, s, E, k, expert, total, dense_matmul, moe_matmul) = symbols(
    "V h s E k expert total dense_block_matmul moe_block_matmul")
(dense_block, moe_block, final) = symbols("dense_block moe_block final")
_TIED = "a tied head is the embedding, counted once: head 0"
TOTAL = Term(n_layers * per_dense + embedding + final_norm + head,
             "n_layers per_dense_block embedding final_layernorm head", _TIED)
TOTAL_MOE = Term(n_dense * per_dense + n_moe * per_moe + embedding + final_norm + head,
                 "n_dense_layers per_dense_block n_moe_layers per_moe_block embedding final_layernorm head", _TIED)
EMBEDDING = Term(V * h, "V h", "tokens")
EMBEDDING_LEARNED = Term(V * h + s * h, "V h s", "tokens, learned positions")
NON_EMBEDDING = Term(total - embedding, "total embedding")
ACTIVE = Term(total - n_moe * (E - k) * expert, "total n_moe_layers E k expert", "k of E experts per MoE layer")
_MATMUL = "block weight matrices and the head, tied or not; not embeddings, biases or LayerNorms"
MATMUL_PER_TOKEN = Term(n_layers * dense_matmul + V * h, "n_layers dense_block_matmul V h", _MATMUL)
MATMUL_PER_TOKEN_MOE = Term(n_dense * dense_matmul + n_moe * moe_matmul + V * h,
                            "n_dense_layers dense_block_matmul n_moe_layers moe_block_matmul V h",
                            "the router and k of E experts in an MoE block; " + _MATMUL)
RANK = Term(n_dense * dense_block + n_moe * moe_block + embedding + final,
            "n_dense_layers dense_block n_moe_layers moe_block embedding final",
            "one block's share on tensor rank 0, split as torch.chunk does, biases of row-parallel layers and "
            "LayerNorms replicated; an MoE block holds E/ep experts and the whole router; embeddings on the first "
            "stage, final LayerNorm + head on the last (0 elsewhere); a tied head on a pipeline's last stage is a copy")

