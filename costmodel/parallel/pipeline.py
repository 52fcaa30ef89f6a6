"""What one pipeline rank holds: its layers, the micro-batches it keeps in flight, and the
buffers a pipelining runtime allocates for it.

Stages: ``pp · v`` virtual stages, rank r holding stages r, r + pp, ... (interleaved 1F1B;
Narayanan et al. 2021, Sec. 2.2), with the layers split as evenly as they go and the
earlier stages taking the extra ones (torch.distributed.pipelining users and Megatron's
uneven splits put the spare layers where they choose; this is the convention costmodel
states). The first stage has the embedding, the last the final norm and the head.

In flight: under 1F1B rank r runs pp - 1 - r warm-up forwards, then one forward before each
backward, so it keeps min(pp - r, m) micro-batches; interleaved, (v - 1)·m_r + 2(pp - 1 - r)
warm-up chunks plus one (m_r micro-batches per round; torch's ``_get_warmup_ops``, Megatron's
``get_forward_backward_func``), at most m·v; the first rank's count is Narayanan et al.'s
1 + (pp - 1)/(pp·v) stages' worth.

Memory is reported for three ranks, whose maximum is every rank's: the first (most in flight
and the embedding), the second (as many layers with one micro-batch less, but both kinds of
receive buffer) and the last (the head, its logits and one micro-batch in flight). Ranks
between have fewer layers or micro-batches in flight than the second, and the same buffers.

DualPipe (``ParallelSpec.pp_schedule``; DeepSeek-AI 2024, "DeepSeek-V3 Technical Report",
Sec. 3.2.1, Table 2; deepseek-ai/DualPipe): the model's pp stages are fed from both ends, so
rank r holds stage r of one direction and stage pp - 1 - r of the other (twice a stage's
parameters; the end ranks both the embedding and the head) and keeps pp + 1 micro-batches'
stage activations in flight; a micro-batch passes each rank once. DualPipeV (DualPipe cut in
half: torch.distributed.pipelining's ``ScheduleDualPipeV``, which torchtitan runs) splits
the layers into 2 pp stages in a V, rank r holding stages r and 2pp - 1 - r (a rank's layers
once, as two virtual stages; rank 0 both the embedding and the head), 2pp + 1 of them in
flight (``_calculate_single_rank_operations``' peak on every rank). Under either, two
ranks bound every rank: an end one and the second.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from costmodel.specs.frameworks import traits_of
from costmodel.specs.parallel import ParallelSpec
from costmodel.symbols.algebra import shared
from costmodel.symbols.core import L, N_pp, m, sceil, sfloor, smax, smin, v
from costmodel.symbols.ops import integer, ratio, smod

if TYPE_CHECKING:  # sympy: only where a formula is asked for
    import sympy as sp


@dataclass(frozen=True)
class PipelineRank:
    """One pipeline rank: its position (its index, or -1 for the last, pp - 1) and whether it
    holds the first stage (the embedding) and the last (the head). Hashable whatever pp
    reads as, so :func:`~costmodel.symbols.algebra.shared` formulas of a rank are computed
    once per reading."""

    position: int
    first: bool
    last: bool

    @property
    def index(self) -> sp.Expr:
        """The rank's index: its position, or pp - 1 for the last."""
        return N_pp - 1 if self.position < 0 else integer(self.position)

    @property
    def name(self) -> str:
        return "first" if self.first else "last" if self.last else "second"


def dualpipe(par: ParallelSpec) -> bool:
    """Whether the pipeline runs DualPipe (module docstring)."""
    return par.pp > 1 and par.pp_schedule == "dualpipe"


def bidirectional(par: ParallelSpec) -> bool:
    """Whether micro-batches enter from both ends and each forward runs beside another's
    backward: DualPipe or DualPipeV (module docstring)."""
    return par.pp > 1 and par.pp_schedule in ("dualpipe", "dualpipev")


def schedule_name(par: ParallelSpec) -> str | None:
    """How answers name a bidirectional schedule (DualPipe, DualPipeV); None otherwise."""
    if not bidirectional(par):
        return None
    return "DualPipe" if par.pp_schedule == "dualpipe" else "DualPipeV"


def stages_held(par: ParallelSpec) -> int:
    """Copies of a stage's layers a rank holds per stage it runs a micro-batch through:
    2 under DualPipe (one per direction), else 1."""
    return 2 if dualpipe(par) else 1


def ranks(par: ParallelSpec) -> list[PipelineRank]:
    """The ranks (pp > 1) whose maximum is every rank's (module docstring; the second
    counts where :func:`present`)."""
    if bidirectional(par):  # rank 0 holds both ends (DualPipe: rank pp - 1 mirrors it)
        return [PipelineRank(0, True, True), PipelineRank(1, False, False)]
    return [PipelineRank(0, True, False), PipelineRank(1, False, False),
            PipelineRank(-1, False, True)]  # fmt: skip


def present(rank: PipelineRank) -> sp.Expr:
    """1 where ``rank`` exists: the second rank is the last one when pp = 2 (expressions
    are built once for every pp > 1, so this stays symbolic)."""
    return integer(1) if rank.first or rank.last else smin(N_pp - 2, 1)


def slots(par: ParallelSpec) -> tuple[int, int, sp.Expr]:
    """(embedding slot, loss slot, layer slots the split divides): L, plus one for each of
    the embedding and the loss the split counts as a layer (``pp_split_embedding``,
    ``pp_split_loss``: Megatron-Core's ``--account-for-*-in-pipeline-split``)."""
    emb, loss = int(par.pp_split_embedding), int(par.pp_split_loss)
    return emb, loss, L + emb + loss


@shared
def rank_layers(par: ParallelSpec, rank: PipelineRank) -> sp.Expr:
    """Blocks on ``rank``: v·floor(S/(pp·v)) slots of the S the split divides (:func:`slots`)
    plus one for each of its stages among the first S mod (pp·v), which take the extra
    ones; less the embedding's slot on the first rank and the loss's on the last."""
    emb, loss, total = slots(par)
    stages = N_pp * v
    extra = smod(total, stages)
    if bidirectional(par):  # stages r and pp·v - 1 - r, the earlier taking the spare slots
        spare = sum((smin(1, smax(0, extra - j)) for j in (rank.index, stages - 1 - rank.index)),
                    integer(0))  # fmt: skip
        return 2 * sfloor(total / stages) + spare - emb * rank.first - loss * rank.last
    spare = smin(v, smax(0, sceil((extra - rank.index) / N_pp)))
    return v * sfloor(total / stages) + spare - emb * rank.first - loss * rank.last


def leading_layers(par: ParallelSpec, rank: PipelineRank, count: sp.Expr) -> sp.Expr:
    """How many of the model's first ``count`` blocks (an MoE model's dense leading ones)
    ``rank`` holds: their overlap with its first virtual stage, the rank's only stage
    among the first pp (a layout rule keeps the leading blocks within those)."""
    emb, loss, total = slots(par)
    per, extra = sfloor(total / (N_pp * v)), smod(total, N_pp * v)
    j = rank.index  # the rank's first virtual stage (the last stage too, uninterleaved)
    start = j * per + smin(j, extra) - (0 if rank.first else emb)
    last = rank.last and par.pp_interleave == 1 and not bidirectional(par)  # stage r only
    size = per + smin(1, smax(0, extra - j)) - emb * rank.first - loss * last
    return smax(0, smin(count, start + size) - start)


def chunks_in_flight(par: ParallelSpec, rank: PipelineRank) -> sp.Expr:
    """Stage-micro-batches ``rank`` keeps activations for at once (module docstring); under
    combined 1F1B (``ep_overlap``) one more, its extra warm-up forward; under DualPipe pp + 1
    stage-micro-batches (Table 2 of the DeepSeek-V3 report; every rank, an upper bound),
    under DualPipeV 2pp + 1 of its m·2 virtual-stage-micro-batches (torch's schedule)."""
    if bidirectional(par):
        return smin(N_pp * v + 1, m * v)
    if par.pp_interleave == 1:
        return smin(N_pp - rank.index, m)
    return smin(_interleaved_warmup(rank) + 1 + int(par.ep_overlap), m * v)


def _interleaved_warmup(rank: PipelineRank) -> sp.Expr:
    """Forwards ``rank`` runs before its first backward under interleaved 1F1B (module
    docstring), uncapped."""
    per_round = m / smax(1, sfloor(m / N_pp))
    return (v - 1) * per_round + 2 * (N_pp - 1 - rank.index)


def combined_alone(par: ParallelSpec) -> sp.Expr:
    """The share of its stage-micro-batches whose forward, and as many whose backward, the
    first pipeline rank runs alone under combined 1F1B (``ep_overlap``), where no other
    micro-batch's pass hides their all-to-alls: without pipelining the first forward and the
    last backward (Megatron-Core's ``combined_1f1b_schedule_for_no_pipelining``: m - 1
    combined steps), interleaved its warm-up forwards, one more than interleaved 1F1B's,
    and its cool-down backwards. The first rank has the most warm-up: an upper bound.
    Under DualPipe the first rank overlaps m - 3pp/2 + 1 forward-backward pairs (its main
    step's 2(m/2 - pp + 1) and its fifth step's pp/2 - 1, ``dualpipe/dualpipe.py``), so
    3pp/2 - 1 of its m forwards run alone; under DualPipeV, over 2pp stages, 3pp - 1 of its
    2m (torch's ``ScheduleDualPipeV`` on rank 0)."""
    if par.pp == 1:
        return 1 / m
    if bidirectional(par):
        return smin(ratio(3, 2) * N_pp * v - 1, m * v) / (m * v)
    first = PipelineRank(0, True, False)
    return smin(_interleaved_warmup(first) + 1, m * v) / (m * v)


def grads_at_fullest(par: ParallelSpec, rank: PipelineRank) -> sp.Expr:
    """1 when ``rank`` holds gradients while it is at its fullest, else 0: only when a
    steady state follows its warm-up (more stage-micro-batches, m·v, than it keeps in
    flight); when warm-up runs every forward, its first backward starts with none."""
    return smin(1, smax(0, m * v - chunks_in_flight(par, rank)))


def held_layers(par: ParallelSpec, rank: PipelineRank) -> sp.Expr:
    """Layer-micro-batches of activations ``rank`` keeps at its fullest: the chunks in
    flight times the layers of one of its stages."""
    return chunks_in_flight(par, rank) * rank_layers(par, rank) / (v * stages_held(par))


def in_flight_per_stage(par: ParallelSpec, rank: PipelineRank) -> sp.Expr:
    """Micro-batches in flight per stage ``rank`` holds: its chunks in flight over the
    stages it holds (v interleaved, 2 under DualPipe)."""
    return chunks_in_flight(par, rank) / (v * stages_held(par))


def boundary_tensors(par: ParallelSpec, rank: PipelineRank) -> tuple[sp.Expr, sp.Expr]:
    """(receive buffers kept across steps, boundary tensors kept beyond what autograd saves
    while ``rank`` is at its fullest), in units of one micro-batch's stage-boundary
    activation.

    torch.distributed.pipelining allocates, per local stage and micro-batch, a buffer for
    the activation it receives (every stage but the first) and one for the gradient
    (every stage but the last), once, and keeps them (``_setup_forward_recv_info``,
    ``_create_grad_recv_info``). It keeps each forward's output until that micro-batch's
    backward (``fwd_cache``), where one device's autograd would keep it only as the next
    layer's saved input; the received activation is that saved input, already a buffer.
    Per chunk in flight: +1 on the first stage, -1 on the last, 0 between; interleaved, a
    rank's chunks are its stages' in equal parts."""
    if dualpipe(par) or not traits_of(par).torch_pipelining:  # Megatron (and DualPipe)
        # receive into fresh tensors and free a stage's output once sent
        # (deallocate_output_tensor; DualPipe's _free_tensors)
        return integer(0), integer(0)
    buffers = m * (2 * v - int(rank.first) - int(rank.last))
    kept = (int(rank.first) - int(rank.last)) * chunks_in_flight(par, rank) / v
    return buffers, kept


def pipeline_bubble(
    par: ParallelSpec, forward: sp.Expr, backward: sp.Expr, weights: sp.Expr
) -> sp.Expr:
    """Seconds a pipeline rank idles per step, from one micro-batch's ``forward`` and
    ``backward`` seconds on its stage: 1F1B's (pp - 1)(F + B) / v (Narayanan et al. 2021,
    Sec. 2.2) where the m micro-batches fill the pipeline (m >= pp); with fewer, the first
    stage waits for a micro-batch to come round before its next chunk, so the v chunks
    save only on the m - 1 that follow the first: (pp - m + (m - 1) / v)(F + B) (stage s
    runs chunk c of micro-batch j at (c pp + s + j) chunk-times, the last forward ending
    at v pp + m - 1; without interleaving both read (pp - 1)(F + B)). DualPipe's
    (pp/2 - 1)(F&B + B - 3W), F&B a forward and a backward run together (their compute;
    the communication they hide is priced with the phases) and W the ``weights``'
    gradients (DeepSeek-V3 report, Table 2), over its pp·v stages of 1/v of a rank's
    layers each (DualPipeV: 2pp stages, each half a rank's)."""
    if bidirectional(par):
        stages = N_pp * v
        return (stages / 2 - 1) * smax(0, forward + 2 * backward - 3 * weights) / v
    return (forward + backward) * (smax(N_pp - m, 0) + (smin(m, N_pp) - 1) / v)
