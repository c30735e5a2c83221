"""The config schema: every key an experiment may set, with its type and default.

OmegaConf builds a structured config from `Config`, so an unknown key or a wrong type is an error.
Sections of later stages keep the paper's defaults (method.md); comments say what each key does.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from qkvqa.components.registry import ComponentSpec
from qkvqa.data.config import DataConfig
from qkvqa.data.protocols import PROTOCOLS


@dataclass
class PathsConfig:
    """Where runs and shared artefacts go."""

    checkpoints_root: str = "checkpoints"  # one directory per run below it
    cache_dir: str = ".cache/qkvqa"  # reusable artefacts (embeddings, indexes, ViT cache)
    world_dir: Optional[str] = None  # a synthetic world written by `qkvqa synth`
    # the folder the README's `huggingface-cli download ... --local-dir` commands fill (preset=local_weights sets
    # `weights`): when set, each component's hub id is read from {weights_dir}/{hub id} (qkvqa.components.hub)
    weights_dir: Optional[str] = None


@dataclass
class ComponentsConfig:
    """The model components; each is built by `qkvqa.components.build_component`."""

    qformer: ComponentSpec = field(
        default_factory=lambda: ComponentSpec(kind="blip2_qff", pretrained="Salesforce/blip2-itm-vit-g")
    )
    image_encoder: ComponentSpec = field(
        default_factory=lambda: ComponentSpec(kind="evaclip_hf", pretrained="BAAI/EVA-CLIP-8B", dtype="fp16")
    )
    text_encoder: ComponentSpec = field(
        default_factory=lambda: ComponentSpec(kind="evaclip_hf", pretrained="BAAI/EVA-CLIP-8B", dtype="fp16")
    )
    reranker: ComponentSpec = field(
        default_factory=lambda: ComponentSpec(kind="bge_reranker", pretrained="BAAI/bge-reranker-v2-m3", dtype="fp16")
    )
    generator: ComponentSpec = field(
        default_factory=lambda: ComponentSpec(kind="qwen2_5_vl", pretrained="Qwen/Qwen2.5-VL-7B-Instruct", dtype="bf16")
    )
    judge: ComponentSpec = field(
        default_factory=lambda: ComponentSpec(kind="bem", pretrained="kortukov/answer-equivalence-bem")
    )
    splitter: ComponentSpec = field(default_factory=lambda: ComponentSpec(kind="spacy_sentencizer", tiny=True))


@dataclass
class RetrieverPretrainConfig:
    """Contrastive training of the stage-1 image encoder here, on the train split (`qkvqa pretrain-retriever`)."""

    steps: int = 600  # optimizer steps
    batch_size: int = 64  # query images per step, each with one KB image of its gold article (in-batch negatives)
    lr: float = 1.0e-3  # AdamW peak lr (linear warm-up over 5 %, then linear decay to 0)
    temperature: float = 0.07  # InfoNCE temperature
    seed: int = 0
    # null: train the base encoder's own weights; N: first widen its towers to N (hidden and projection; new random
    # weights from `seed`), as a tiny 16-d stand-in cannot hold the 2-3 entities of a multi-entity photo in one vector
    width: Optional[int] = None


@dataclass
class RetrievalConfig:
    """Stage 1: image -> article retrieval with faiss (method.md section 1)."""

    mode: str = "image_to_summary"  # image_to_summary | image_to_image
    summary_source: str = "lead_section"  # lead_section | summaries (from `qkvqa summarize`)
    summaries: Optional[str] = None  # JSONL of per-article summaries
    top_k: int = 20
    index_factory: str = "Flat"  # faiss factory string: Flat, IVF4096,Flat, HNSW32, IVF4096,PQ64
    index_dir: Optional[str] = None
    nprobe: int = 32
    embed_dtype: str = "float16"  # shard dtype: float16 | float32
    embed_batch_size: int = 64
    shard_size: int = 50000
    results: Optional[str] = None  # retrieval results JSON (OMGM layout) to read instead of retrieving
    # the least share of a split's questions that a results file (retrieval.results, eval.reranked_results)
    # must cover; below it the run stops before any model runs, naming the file and the missing ids
    min_results_coverage: float = 0.95
    two_hop_policy: str = "exclude"  # recall for 2_hop gold URLs: first | any | exclude
    split: str = "test"  # question split of `qkvqa retrieve` and of query_images embeddings
    embed_what: str = "kb"  # `qkvqa embed` target: kb (the KB side of `mode`) | kb_text | kb_images | query_images
    embed_dir: Optional[str] = None  # root of the embedding shard sets; null = {paths.cache_dir}/embeddings
    max_images_per_article: Optional[int] = (
        None  # image_to_image: embed at most this many image_urls per article; null = all
    )
    index_train_size: int = 262144  # vectors sampled (seeded) to train IVF / PQ indexes
    index_add_batch: int = 65536  # vectors converted and added per step (bounds the RAM beside the index)
    index_gpu: bool = True  # use faiss GPU indexes when faiss-gpu and a GPU are present
    hnsw_ef_search: int = 128  # HNSW search depth (efSearch)
    image_search_factor: int = 4  # image_to_image: images searched per wanted article before dedup (grown when short)
    search_batch_size: int = 4096  # query vectors per faiss search call
    pretrain: RetrieverPretrainConfig = field(default_factory=RetrieverPretrainConfig)


@dataclass
class TextPretrainConfig:
    """Masked-language pretraining of the Q-Former's text layers made here (components.qformer.init=pretrained_here)."""

    steps: int = 1500  # optimizer steps
    batch_size: int = 32  # texts per step
    lr: float = 1.0e-3  # AdamW peak lr (linear warm-up over 5 %, then linear decay to 0)
    mask_prob: float = 0.15  # share of the tokens masked (BERT's 80/10/10 rule)
    max_tokens: int = 128  # texts cut to this many tokens
    seed: int = 0


@dataclass
class QFFConfig:
    """The Question-Focused Filter: model switches, scoring and contrastive training (method.md 2-3)."""

    focus: str = "per_layer"  # per_layer | input | none
    gate: str = "tanh"  # focus gate: tanh (starts closed at gate_init 0) | none (the paper's plain residual block)
    gate_init: float = 0.0  # initial gate parameter (tanh of it is the opening); 0 = stock Q-Former at step 0
    new_block_lr_scale: float = (
        1.0  # learning-rate multiplier of the new focus blocks and gates (gates take no weight decay)
    )
    alpha: float = 0.9  # fused score S = alpha * sim_ret + (1 - alpha) * QFF
    # the section scorer (qkvqa.qff.scorers, docs/extending.md): a registered name (late_interaction, the paper's) or
    # a SectionScorer subclass in your own code, module.path:ClassName; training, rerank and evaluate all score with it
    scorer: str = "late_interaction"
    scorer_options: Dict[str, Any] = field(default_factory=dict)  # the scorer's declared options (checked on compose)
    score_direction: str = (
        "question_to_section"  # late-interaction direction: question_to_section | section_to_question
    )
    # how the question's query tokens are unit-normalised before late interaction at inference (rerank, evaluate,
    # the validation article R@1): per_token (the paper's cosine, qkvqa's default) | across_tokens (OMGM's released
    # step 2b: F.normalize(tokens) with its default dim=1, each hidden channel across the query tokens, about
    # sqrt(hidden / queries) times a cosine: docs/protocol.md "Readings"). The training loss is per_token either way.
    question_norm: str = "per_token"
    num_negatives: int = 15
    temperature: float = 0.07
    learnable_temperature: bool = False
    in_batch_negatives: bool = False
    max_text_tokens: int = 512
    question_max_tokens: int = 64
    blip_text_preprocess: bool = True  # LAVIS blip_caption cleaning of questions and sections (OMGM)
    image_transform: str = "targetpad"  # targetpad (OMGM: pad to a 1.25:1 ratio, resize, centre crop) | squash
    lr: float = 1.0e-5
    weight_decay: float = 0.05
    betas: List[float] = field(default_factory=lambda: [0.9, 0.98])
    eps: float = 1.0e-7
    pct_start: float = 0.3
    div_factor: float = 100.0
    gradient_checkpointing: bool = False
    attention: str = (
        "sdpa"  # Q-Former attention: sdpa (fused kernels) | eager (the HF modules: the stock Q-Former bit for bit)
    )
    freeze_vit: bool = True
    vit_cache: Optional[str] = None  # directory written by `qkvqa cache-vit`
    negatives: Optional[str] = None  # hard-negative pools (OMGM step1_HardNeg layout)
    checkpoint: Optional[str] = None  # trained QFF weights (safetensors) for rerank/evaluate
    allow_untrained: bool = False  # evaluate with eval.filter=qff and no qff.checkpoint: an untrained QFF, on purpose
    max_train_samples: Optional[int] = None
    section_batch_size: int = 64  # sections encoded per forward at inference
    question_batch_size: int = 8  # questions whose sections are scored together at inference (rerank, evaluate)
    vit_lru_size: int = 256  # article-image ViT states kept in memory across questions (0: off)
    val_negatives: Optional[str] = None  # validation pools (`qkvqa mine split=val`); null: no validation
    mining_top_k: int = 20  # stage-1 articles whose sections become negatives (OMGM: top-20)
    mining_gold_sections: int = 3  # other sections of the gold article used as negatives (OMGM: 3)
    keep_gold_negatives: bool = False  # those sections always among the drawn negatives (OMGM: all drawn at random)
    val_top_k: int = 20  # stage-1 articles reranked per val question for val/article_r1
    max_val_samples: Optional[int] = None  # cap on validation samples (seeded subset); null: all
    vit_cache_shard_size: int = 512  # images per ViT cache shard (ViT-g: ~0.7 MB per image in fp16)
    vit_cache_batch_size: int = 32  # images per ViT forward while writing the cache
    schedule_steps: Optional[int] = None  # OneCycle length in optimizer steps; null: the run's planned steps
    dropout: Optional[float] = None  # training dropout of the Q-Former and focus blocks; null: the model's (0.1)
    # components.qformer.init=pretrained_here: masked-language modelling of the Q-Former's text layers on the KB's
    # candidate sections and the training questions before QFF training (qkvqa.qff.pretrain_here)
    text_pretrain: TextPretrainConfig = field(default_factory=TextPretrainConfig)


def qff_settings(section: Any = None) -> QFFConfig:
    """The one typed object every command reads the QFF's settings from: the `qff:` section (a QFFConfig, its
    DictConfig, or a plain mapping such as a trainer checkpoint's hyper-parameters; None: the defaults) as a
    `QFFConfig`, missing keys at their defaults; an unknown key or a value of the wrong type is refused, naming it."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    from qkvqa.errors import ConfigError

    if isinstance(section, QFFConfig):
        return section
    if section is None:
        return QFFConfig()
    try:
        return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(QFFConfig), section))
    except OmegaConfBaseException as e:
        key = f"qff.{e.full_key}" if getattr(e, "full_key", None) else "qff"
        raise ConfigError(f"{key}: {e.msg.splitlines()[0]} (the qff section's keys: qkvqa.config.schema.QFFConfig)")


@dataclass
class CDAConfig:
    """Chunk-based dynamic cross-article selection (method.md section 4)."""

    mode: str = "full"  # full | top1_section | first_chunk | top1_article_chunks
    # top1_section mode (Table 5 before CDA, "the top-1 section from the top-1 article using QFF and
    # BGE-Reranker-v2-m3"): the section of the top-1 article with the best qff score, bge score (sigmoid),
    # or fused = beta * qff + (1 - beta) * bge, OMGM's step-3 mix (beta 0.2 in its script; docs/cda.md).
    top1_section_by: str = "fused"
    top1_section_beta: float = 0.2  # the QFF score's weight in the fused top-1 section score (OMGM: 0.2)
    top1_section_max_length: int = 6000  # BGE reads (question, section) up to this many tokens (OMGM: 6000)
    U: Optional[int] = 2  # at most U articles; null lifts the limit
    theta: Optional[float] = 0.01  # keep article i when S_1 - S_i <= theta; null lifts it
    # the score theta compares (docs/protocol.md "Readings"): fused (S, the paper's Eq. 11 as qkvqa reads it) |
    # qff (the articles' QFF scores, "based on QFF scores") | softmax (of S / qff.temperature over the ranked articles)
    theta_on: str = "fused"
    chunk_tokens: int = 60  # L, in generator tokens (60 E-VQA, 90 InfoSeek)
    # what L counts: body (the chunk's sentences; the "# Wiki Article / ## Section Title" header comes on top) |
    # with_header (header and body together stay within L, where the sentences allow)
    chunk_length_counts: str = "body"
    K1: int = 4
    K2: int = 2
    reranker_batch_size: int = 64
    reranker_max_length: int = 512
    reranker_normalize: bool = True  # sigmoid of the reranker logit


@dataclass
class GenerationConfig:
    """Answer generation (method.md section 5)."""

    prompt: str = "auto"  # auto (dataset x generator type) | template
    template: Optional[str] = None  # custom template with {question} and {context}
    template_system: Optional[str] = None  # system prompt used with prompt=template (null: none)
    max_new_tokens: int = 128
    batch_size: int = 4
    backend: str = "hf"  # hf | vllm (separate environment)
    # generator: the components.generator's answers; extractive: a tiny extractive reader answers instead (the demo:
    # the span after the linking word of the context sentence nearest the question; generation.tiny.ExtractiveReader)
    reader: str = "generator"
    filter_top_n: int = 5  # MLLM-filtering baseline: articles read per question
    summary_template: Optional[str] = None  # `qkvqa summarize` prompt with {title}, {context}; null: built-in
    summary_context_tokens: int = 512  # article text shown per summary, in generator tokens
    summary_max_new_tokens: int = 60  # summary length cap (EVA-CLIP's text tower reads 77 tokens)


@dataclass
class EvalConfig:
    """Evaluation of a pipeline run."""

    split: str = "test"
    filter: str = "qff"  # qff | retrieval (no filter) | precomputed (eval.reranked_results)
    judge: str = "bem"  # bem | em_only (E-VQA; InfoSeek has no judge)
    context: str = "cda"  # cda | mllm_filter (the Table 2 baseline, generation.filter_top_n articles)
    reranked_results: Optional[str] = None  # read QFF-reranked results instead of running the QFF
    # Diagnosis only: leave questions that could not be answered (unreadable query image) out of every
    # metric. The default counts them as wrong answers and retrieval misses, as the paper's n does.
    exclude_skipped: bool = False
    # generation (default): the whole pipeline; filter: stop after the article filter, for filter-only
    # studies (Figure 5's alpha sweep: single-hop article R@1 after the filter), with no CDA or generator.
    stop_after: str = "generation"
    # Under torchrun/srun, ranks >= 1 wait this long for rank zero's stage-1 results (the barrier after stage 1).
    stage1_wait_s: float = 7200.0
    # Refuse what is otherwise counted and warned: question rows that repeat another row exactly (`--strict`).
    strict: bool = False


@dataclass
class TrainerConfig:
    """Arguments of lightning.Trainer that experiments may set."""

    accelerator: str = "auto"
    devices: Any = 1
    num_nodes: int = 1
    strategy: str = "auto"
    precision: str = "32-true"
    max_epochs: int = 1
    max_steps: int = -1
    accumulate_grad_batches: int = 1
    gradient_clip_val: Optional[float] = None
    log_every_n_steps: int = 10
    val_check_interval: Optional[float] = None
    check_val_every_n_epoch: int = 1
    limit_train_batches: Optional[float] = None
    limit_val_batches: Optional[float] = None
    num_sanity_val_steps: int = 0
    deterministic: bool = False
    enable_progress_bar: bool = True  # progress of fit / predict: a bar or lines by logger.progress.mode
    enable_model_summary: bool = False  # Lightning's parameter table; off: one qkvqa log line at fit start
    detect_anomaly: bool = False
    fast_dev_run: bool = False


@dataclass
class CheckpointConfig:
    """What ModelCheckpoint keeps in the run directory."""

    monitor: Optional[str] = None  # e.g. val/article_r1; null keeps only last.ckpt + periodic
    mode: str = "max"
    save_top_k: int = 1
    every_n_train_steps: Optional[int] = None
    save_on_exception: bool = True
    # A stop signal is honoured within this many seconds (SLURM's `--signal=USR1@90` lead minus a margin): one during
    # a validation at its next batch (the state before it is saved, the validation runs first on resume); one that
    # several ranks wait on during data preparation (no training yet) stops the job once this has passed. null: wait.
    stop_within_s: Optional[float] = 60.0


@dataclass
class WandbConfig:
    """Weights & Biases logging; the local run record is always written as well."""

    enabled: bool = True
    project: str = "qkvqa"
    entity: Optional[str] = None
    group: Optional[str] = None
    tags: List[str] = field(default_factory=list)
    mode: Optional[str] = None  # online | offline | disabled; null follows WANDB_MODE
    eval_table: bool = True  # evaluations log the per-question results as the table `eval/predictions`
    eval_table_images: bool = False  # ... with each question's query image (larger runs)


@dataclass
class ProgressConfig:
    """Progress of long loops (training, prediction, embed, mine, rerank, ...); see qkvqa.utils.progress."""

    # auto: bars when stdout and stderr are terminals, else plain lines (a SLURM log, `> log.txt`) |
    # bar | lines | off; null follows QKVQA_PROGRESS (0 = off, 1 = auto, bar, lines), else auto
    mode: Optional[str] = None
    every_s: float = 30.0  # lines: one at least this often (0: only at the fractions)
    every_fraction: float = 0.1  # lines: and at each such fraction of a loop of known length (0: none)


@dataclass
class LoggerConfig:
    """Loggers: W&B plus the local run record, and the progress display."""

    wandb: WandbConfig = field(default_factory=WandbConfig)
    progress: ProgressConfig = field(default_factory=ProgressConfig)


@dataclass
class Config:
    """A whole experiment."""

    experiment: str = "base"  # set by `experiment=NAME`
    task: str = "evaluate"  # the command an experiment is for: train | evaluate | retrieve | rerank
    presets: List[str] = field(default_factory=list)  # set by `preset=a,b`
    run_id: Optional[str] = None  # else WANDB_RUN_ID of a sweep agent, else a new id
    resume: str = "never"  # never | auto (continue checkpoints/<run_id>/last.ckpt)
    seed: int = 0
    notes: str = ""
    paper: Optional[str] = (
        None  # the paper row an experiment reproduces (a key of qkvqa.config.paper_rows), for the protocol card
    )
    tags: List[str] = field(default_factory=list)
    paths: PathsConfig = field(default_factory=PathsConfig)
    data: DataConfig = field(default_factory=DataConfig)
    components: ComponentsConfig = field(default_factory=ComponentsConfig)
    retrieval: RetrievalConfig = field(default_factory=RetrievalConfig)
    qff: QFFConfig = field(default_factory=QFFConfig)
    cda: CDAConfig = field(default_factory=CDAConfig)
    generation: GenerationConfig = field(default_factory=GenerationConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)


# Value constraints, checked when a config is composed (before any work). CHOICES: the allowed values
# (the modules that act on them import these tuples). BOUNDS: inclusive (low, high), None = unbounded;
# a key whose schema type is Optional may also be null.
FOCUS_MODES = ("per_layer", "input", "none")
FOCUS_GATES = ("tanh", "none")
IMAGE_TRANSFORMS = ("targetpad", "squash")
CDA_MODES = ("full", "top1_section", "first_chunk", "top1_article_chunks")
TOP1_SECTION_BY = ("qff", "bge", "fused")
QUESTION_NORMS = ("per_token", "across_tokens")  # qff.question_norm (qkvqa.qff.scoring.late_interaction)
THETA_ON = ("fused", "qff", "softmax")  # cda.theta_on (qkvqa.cda.select.theta_scores)
CHUNK_LENGTH_COUNTS = ("body", "with_header")  # cda.chunk_length_counts (qkvqa.cda.chunker.Chunker)
SCORE_DIRECTIONS = ("question_to_section", "section_to_question")  # late interaction: max over which side
EVAL_FILTERS = ("qff", "retrieval", "precomputed")
ATTENTION_IMPLEMENTATIONS = ("sdpa", "eager")  # qkvqa.qff.attention
# components.qformer.init: the fixed values (qkvqa.qff.pretrain_here) and `bert:<hub id or directory>`, a Q-Former
# shaped like that BERT and started from it (qkvqa.qff.builder.write_bert_blip2)
QFORMER_INITS = ("checkpoint", "pretrained_here")
QFORMER_BERT_INIT = "bert:"
STOP_AFTER = ("generation", "filter")
PROGRESS_MODES = ("auto", "bar", "lines", "off")  # qkvqa.utils.progress.MODES
SPLITS = ("train", "val", "test")  # eval.split: the data.<split>_questions files
# eval.split spellings read as the split they name (`eval.split=validation` is the val split)
SPLIT_ALIASES = {"validation": "val", "valid": "val", "dev": "val", "testing": "test", "training": "train"}
CHOICES = {
    "eval.split": SPLITS,
    "resume": ("never", "auto"),
    "task": ("train", "evaluate", "retrieve", "rerank"),
    "data.dataset": ("evqa", "infoseek"),
    "data.protocol": tuple(PROTOCOLS),
    "retrieval.mode": ("image_to_summary", "image_to_image"),
    "retrieval.two_hop_policy": ("exclude", "first", "any"),
    "retrieval.summary_source": ("lead_section", "summaries"),
    "qff.focus": FOCUS_MODES,
    "qff.gate": FOCUS_GATES,
    "qff.attention": ATTENTION_IMPLEMENTATIONS,
    "qff.image_transform": IMAGE_TRANSFORMS,
    "components.qformer.init": QFORMER_INITS,
    **{
        f"components.{name}.init": ("checkpoint",)
        for name in ("image_encoder", "text_encoder", "reranker", "generator", "judge", "splitter")
    },
    "qff.score_direction": SCORE_DIRECTIONS,
    "qff.question_norm": QUESTION_NORMS,
    "cda.mode": CDA_MODES,
    "cda.top1_section_by": TOP1_SECTION_BY,
    "cda.theta_on": THETA_ON,
    "cda.chunk_length_counts": CHUNK_LENGTH_COUNTS,
    "eval.filter": EVAL_FILTERS,
    "eval.judge": ("bem", "em_only"),
    "eval.context": ("cda", "mllm_filter"),
    "eval.stop_after": STOP_AFTER,
    "generation.backend": ("hf", "vllm"),
    "generation.reader": ("generator", "extractive"),
    "checkpoint.mode": ("max", "min"),
    "logger.progress.mode": PROGRESS_MODES,
}
BOUNDS = {
    "data.batch_size": (1, None),
    "data.num_workers": (0, None),
    "data.max_questions": (1, None),
    "data.sample_questions": (1, None),
    "data.images.max_missing_fraction": (0.0, 1.0),
    "eval.stage1_wait_s": (1.0, None),
    "retrieval.top_k": (1, None),
    "retrieval.min_results_coverage": (0.0, 1.0),
    "retrieval.nprobe": (1, None),
    "retrieval.shard_size": (1, None),
    "retrieval.embed_batch_size": (1, None),
    "retrieval.search_batch_size": (1, None),
    "qff.alpha": (0.0, 1.0),
    "qff.num_negatives": (1, None),
    "qff.temperature": (1e-6, None),
    "qff.lr": (0.0, None),
    "qff.weight_decay": (0.0, None),
    "qff.pct_start": (0.0, 1.0),
    "qff.div_factor": (1.0, None),
    "qff.new_block_lr_scale": (0.0, None),
    "qff.max_text_tokens": (1, None),
    "qff.question_max_tokens": (1, None),
    "qff.section_batch_size": (1, None),
    "qff.question_batch_size": (1, None),
    "qff.vit_lru_size": (0, None),
    "qff.dropout": (0.0, 1.0),
    "qff.val_top_k": (1, None),
    "retrieval.pretrain.steps": (1, None),
    "retrieval.pretrain.batch_size": (2, None),
    "retrieval.pretrain.lr": (0.0, None),
    "retrieval.pretrain.temperature": (1e-6, None),
    "retrieval.pretrain.width": (4, None),
    "qff.text_pretrain.steps": (1, None),
    "qff.text_pretrain.batch_size": (1, None),
    "qff.text_pretrain.lr": (0.0, None),
    "qff.text_pretrain.mask_prob": (0.01, 0.9),
    "qff.text_pretrain.max_tokens": (8, None),
    "cda.U": (1, None),
    "cda.theta": (0.0, None),
    "cda.chunk_tokens": (1, None),
    "cda.K1": (1, None),
    "cda.K2": (0, None),
    "cda.reranker_batch_size": (1, None),
    "cda.reranker_max_length": (1, None),
    "cda.top1_section_beta": (0.0, 1.0),
    "cda.top1_section_max_length": (1, None),
    "generation.max_new_tokens": (1, None),
    "generation.batch_size": (1, None),
    "generation.filter_top_n": (1, None),
    "logger.progress.every_s": (0.0, None),
    "logger.progress.every_fraction": (0.0, 1.0),
    "checkpoint.stop_within_s": (1.0, None),
}


def check_qformer_init(cfg: Any) -> None:
    """`components.qformer.init: bert:<ref>` names a BERT and comes with `tiny: false` (the Q-Former is that BERT's
    shape and weights, its ViT the tiny random one of the options; `pretrained` is not read, as with `tiny: true`); one
    line naming the key otherwise."""
    from omegaconf import OmegaConf

    from qkvqa.errors import ConfigError

    value = OmegaConf.select(cfg, "components.qformer.init")
    if not (isinstance(value, str) and value.startswith(QFORMER_BERT_INIT)):
        return
    if not value[len(QFORMER_BERT_INIT) :].strip():
        raise ConfigError(
            f"components.qformer.init={value!r} names no BERT: use bert:<hub id or directory>, "
            f"e.g. bert:sentence-transformers/all-MiniLM-L6-v2, or one of {', '.join(QFORMER_INITS)}"
        )
    if OmegaConf.select(cfg, "components.qformer.tiny"):
        raise ConfigError(
            f"components.qformer.init={value!r} builds the Q-Former from that BERT (its ViT the tiny random one of the "
            "options), components.qformer.tiny=true a random tiny one: set components.qformer.tiny=false"
        )


def check_values(cfg: Any) -> None:
    """Refuse a value outside CHOICES / BOUNDS with one line naming the key, the value and what is allowed."""
    from omegaconf import OmegaConf

    from qkvqa.components.hub import under_weights_dir
    from qkvqa.errors import ConfigError

    under_weights_dir(cfg)  # paths.weights_dir: hub ids read from the download layout
    split = OmegaConf.select(cfg, "eval.split")
    if isinstance(split, str) and split.lower() in SPLIT_ALIASES and not OmegaConf.is_readonly(cfg):
        OmegaConf.update(cfg, "eval.split", SPLIT_ALIASES[split.lower()])  # an alias reads as its split
    check_qformer_init(cfg)
    for key, allowed in CHOICES.items():
        value = OmegaConf.select(cfg, key)
        if key == "components.qformer.init" and isinstance(value, str) and value.startswith(QFORMER_BERT_INIT):
            continue  # check_qformer_init
        if key in ("qff.focus", "eval.filter") and isinstance(value, str) and ":" in value:
            continue  # a class by import path: check_plugins
        if value is not None and value not in allowed:
            aliases = (
                " (read as a split: validation, valid, dev = val; testing = test; training = train)"
                if key == "eval.split"
                else ""
            )
            raise ConfigError(f"{key}={value!r} is not one of {', '.join(map(str, allowed))}{aliases}")
    protocol = OmegaConf.select(cfg, "data.protocol")
    if protocol is not None and PROTOCOLS[protocol].dataset not in ("any", OmegaConf.select(cfg, "data.dataset")):
        raise ConfigError(
            f"data.protocol={protocol!r} is a {PROTOCOLS[protocol].dataset} protocol, but data.dataset is "
            f"{OmegaConf.select(cfg, 'data.dataset')!r}"
        )
    from qkvqa.config.paper_rows import paper_row

    paper_row(OmegaConf.select(cfg, "paper"))  # an unknown row name stops here, listing the rows
    for key, (low, high) in BOUNDS.items():
        value = OmegaConf.select(cfg, key)
        if value is None:
            continue
        if (low is not None and value < low) or (high is not None and value > high):
            span = f"at least {low}" if high is None else f"in [{low}, {high}]"
            raise ConfigError(f"{key}={value!r} is out of range: it must be {span}")
    check_component_roles(cfg)
    check_plugins(cfg)


# The config sections whose extension points resolve a class when the config is composed: section -> the function
# ("module:function", a layer above this one, imported by name when the section is set) that refuses an unknown
# name, an import path that does not import or a bad option, naming what is registered (docs/extending.md).
PLUGIN_CHECKS = {
    "qff": "qkvqa.qff.scorers:check_qff_plugins",  # qff.scorer, qff.scorer_options, qff.focus by import path
    "eval.filter": "qkvqa.pipeline.filters:filter_kind",  # eval.filter by import path (the shipped ones: CHOICES)
}


def check_plugins(cfg: Any) -> None:
    """Run each set section's extension-point check (PLUGIN_CHECKS); `eval.filter` only when it is an import path."""
    import importlib

    from omegaconf import OmegaConf

    for section, check in PLUGIN_CHECKS.items():
        value = OmegaConf.select(cfg, section)
        if value is None or (section == "eval.filter" and ":" not in str(value)):
            continue
        module, _, function = check.partition(":")
        getattr(importlib.import_module(module), function)(value)


# The shipped component kinds of each role (slot) of `components:`. A kind of one role in another's slot
# (`components.reranker.kind=bem`) is refused when the config is composed, naming the key; a kind no role lists (a
# plugin's, "Extend without editing qkvqa") is checked against its role's extension point (ROLE_POINTS).
ROLE_KINDS = {
    "image_encoder": ("evaclip_hf", "clip_hf", "timm_image"),
    "text_encoder": ("evaclip_hf", "clip_hf"),
    "qformer": ("blip2_qff",),
    "reranker": ("bge_reranker", "sentence_transformer"),
    "generator": ("llama3", "chat_lm", "qwen2_5_vl", "reflectiva"),
    "judge": ("bem",),
    "splitter": ("spacy_sentencizer",),
}
# The extension point of each role that a user's class may fill by import path (`module:Class`): the point's name,
# its base class ("module:Class") and the modules that register its shipped kinds (imported when the config is
# composed; only those, so that composing does not import every model's code). Any other role takes a ComponentKind
# subclass by import path.
ROLE_POINTS = {
    "generator": ("generator", "qkvqa.generation.backends:GeneratorKind", ("qkvqa.generation.backends",)),
    "reranker": (
        "chunk_scorer",
        "qkvqa.cda.reranker:ChunkScorerKind",
        ("qkvqa.cda.reranker", "qkvqa.cda.sentence_scorer"),
    ),
    "judge": ("judge", "qkvqa.metrics.judge:JudgeKind", ("qkvqa.metrics.bem",)),
}


def check_component_roles(cfg: Any) -> None:
    """ConfigError naming `components.ROLE.kind` when it holds a shipped kind of another role only, a name its role's
    extension point does not register, an import path that does not import or whose class does not subclass the
    point's; and naming `components.ROLE.options.KEY` for an option its kind does not declare or a value of the wrong
    type or out of bounds (kinds that declare typed options: the generators and every plugin)."""
    from omegaconf import OmegaConf

    from qkvqa.errors import ConfigError

    for role, kinds in ROLE_KINDS.items():
        kind = OmegaConf.select(cfg, f"components.{role}.kind", default=None)
        if kind is None or kind in kinds:
            continue
        others = [r for r, ks in ROLE_KINDS.items() if r != role and kind in ks]
        if others:
            raise ConfigError(
                f"components.{role}.kind={kind!r} is a {' / '.join(others)} component, not a {role}; a {role} is one "
                f"of {', '.join(kinds)}"
            )
    check_component_kinds(cfg)


def check_component_kinds(cfg: Any) -> None:
    """Resolve each role's kind at its extension point (a user's class imported by its path) and check its options."""
    import importlib

    from omegaconf import OmegaConf

    from qkvqa.components.plugins import is_import_path
    from qkvqa.components.registry import ComponentKind, component_kind, spec_from_mapping
    from qkvqa.errors import ConfigError

    components = OmegaConf.select(cfg, "components", default=None) or {}
    for role in components:
        name = OmegaConf.select(cfg, f"components.{role}.kind", default=None)
        if not name or (role not in ROLE_POINTS and not is_import_path(name)):
            continue
        point, base, shipped = ROLE_POINTS.get(role, ("component", None, ()))
        for module in shipped:
            importlib.import_module(module)
        base_class = ComponentKind
        if base:
            module, _, attr = base.partition(":")
            base_class = getattr(importlib.import_module(module), attr)
        try:
            kind = component_kind(name, point, base_class)
        except ConfigError as e:
            raise ConfigError(f"components.{role}.kind: {e}") from None
        spec = spec_from_mapping(OmegaConf.to_container(components[role], resolve=True))
        kind.check_options(spec, f"components.{role}.options")


# Keys that may change when a run resumes; any other change is refused (torchtune's policy).
MUTABLE_ON_RESUME = (
    "resume",
    "notes",
    "tags",
    "trainer.max_steps",
    "trainer.max_epochs",
    "trainer.log_every_n_steps",
    "trainer.enable_progress_bar",
    "trainer.enable_model_summary",
    "trainer.val_check_interval",
    "trainer.limit_val_batches",
    "trainer.devices",
    "trainer.num_nodes",
    "trainer.strategy",
    "trainer.accelerator",
    "checkpoint.every_n_train_steps",
    "checkpoint.stop_within_s",
    "logger",
    "paths",
    "data.num_workers",
    "presets",
    # scoring keys: a finished prediction set may be re-scored with another judge (`qkvqa score run RUN_DIR`)
    "eval.judge",
    "components.judge",
    "eval.exclude_skipped",
)
