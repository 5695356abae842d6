"""Which engine and framework a GPU runs: from a pod's containers (image, command and args) or,
in local mode, from its processes (command line, the parents' command lines, loaded libraries).

The tables below are the documented contract (docs/analysis.md, "Engine and framework"). An
engine is a serving engine (vLLM, TGI, Triton, ...), a training launcher or framework (torchrun,
DeepSpeed, NeMo, ...), or a runtime that can do either (Ray); its role, where it has one, is the
classifier's prior (``analysis.Context.priors``) and wins over the pod's owner: a Job that runs
vLLM serves, a Deployment that runs torchrun trains. The framework (PyTorch, TensorFlow, JAX,
...) says nothing about the role: PyTorch serves as much as it trains.

A command names its engine more precisely than an image (a NeMo image can run a vLLM server), so
commands are matched first, then images; within each, the first rule of ``ENGINES`` that
matches wins, so the more specific rules come first. Commands and arguments are matched here and
never kept or logged: they may carry tokens.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from profiler_app.core.model import Identity, Prior

SERVING, TRAINING = Prior.SERVING, Prior.TRAINING


@dataclass(frozen=True)
class EngineRule:
    """How to recognise one engine. Every pattern is optional; any one that matches names it.

    ``programs``: executables by base name, or "program subcommand" ("accelerate launch");
    ``modules``: Python modules run with ``-m`` (a package matches its submodules);
    ``scripts``: Python scripts by base name (a regular expression, matched whole);
    ``flags``: arguments that name it ("--deepspeed" to a training script);
    ``images``: regular expressions searched in the image reference (lower case, without its
    digest), e.g. ``nvcr.io/nvidia/tritonserver:24.08-py3``;
    ``libraries``: regular expressions searched in the paths a process has mapped.
    """

    name: str  # the label value: bounded by this table
    role: Prior | None
    framework: str | None = None  # what it runs on, when no library or image says otherwise
    programs: tuple[str, ...] = ()
    modules: tuple[str, ...] = ()
    scripts: tuple[str, ...] = ()
    flags: tuple[str, ...] = ()
    images: tuple[str, ...] = ()
    libraries: tuple[str, ...] = ()


@dataclass(frozen=True)
class FrameworkRule:
    name: str
    images: tuple[str, ...] = ()
    libraries: tuple[str, ...] = ()


# Image path ends: "(^|/)name(:|$)" is the repository "name" in any registry, any tag.
def _repo(path: str) -> str:
    return rf"(^|/){re.escape(path)}(:|$)"


ENGINES: tuple[EngineRule, ...] = (
    # Serving. Triton's images with another engine inside name that engine.
    EngineRule(
        "tensorrt-llm",
        SERVING,
        "tensorrt",
        programs=("trtllm-serve",),
        modules=("tensorrt_llm",),
        images=(r"(^|/)tritonserver:[^/]*trtllm", r"(^|/)nvidia/tensorrt-llm/"),
        libraries=(r"/tensorrt_llm/",),
    ),
    EngineRule(
        "vllm",
        SERVING,
        "pytorch",
        programs=("vllm",),
        modules=("vllm",),
        images=(r"(^|/)tritonserver:[^/]*vllm", r"(^|/)[^/:]*vllm[^/:]*(:|$)"),
        libraries=(r"/vllm/",),
    ),
    EngineRule(
        "tgi",
        SERVING,
        "pytorch",
        programs=("text-generation-launcher", "text-generation-server"),
        modules=("text_generation_server",),
        images=(_repo("huggingface/text-generation-inference"),),
        libraries=(r"/text_generation_server/",),
    ),
    EngineRule(
        "tei",
        SERVING,
        None,
        programs=("text-embeddings-router",),
        images=(_repo("huggingface/text-embeddings-inference"),),
    ),
    EngineRule(
        "sglang",
        SERVING,
        "pytorch",
        programs=("sglang",),
        modules=("sglang",),
        images=(r"(^|/)[^/:]*sglang[^/:]*(:|$)",),
        libraries=(r"/sglang/", r"/sgl_kernel/"),
    ),
    EngineRule(
        "triton",
        SERVING,
        None,
        programs=("tritonserver",),
        images=(_repo("tritonserver"),),
        libraries=(r"libtritonserver\.so",),  # not libtriton.so: OpenAI Triton, in PyTorch
    ),
    EngineRule("nim", SERVING, None, images=(r"(^|/)nvcr\.io/nim/",)),
    EngineRule(
        "ray-serve",
        SERVING,
        None,
        programs=("serve run", "serve deploy", "serve start"),
        modules=("ray.serve",),
    ),
    EngineRule(
        "kserve",
        SERVING,
        None,
        modules=(
            "kserve",
            "huggingfaceserver",
            "sklearnserver",
            "xgbserver",
            "lgbserver",
            "pmmlserver",
            "paddleserver",
        ),
        images=(r"(^|/)kserve/[^/:]+(:|$)",),
    ),
    EngineRule(
        "torchserve",
        SERVING,
        "pytorch",
        programs=("torchserve",),
        images=(r"(^|/)pytorch/torchserve[^/:]*(:|$)",),
    ),
    EngineRule(
        "tf-serving",
        SERVING,
        "tensorflow",
        programs=("tensorflow_model_server",),
        images=(_repo("tensorflow/serving"),),
    ),
    EngineRule(
        "ollama",
        SERVING,
        "ggml",
        programs=("ollama",),
        images=(_repo("ollama/ollama"),),
    ),
    EngineRule(
        "llama.cpp",
        SERVING,
        "ggml",
        programs=("llama-server",),
        modules=("llama_cpp.server",),
        images=(r"(^|/)(ggml-org|ggerganov)/llama\.cpp:(server|full)",),
        libraries=(r"libllama\.so",),
    ),
    EngineRule(
        "lmdeploy",
        SERVING,
        "pytorch",
        programs=("lmdeploy serve",),
        images=(_repo("openmmlab/lmdeploy"),),
    ),
    # Training launchers and frameworks.
    EngineRule(
        "torchrun",
        TRAINING,
        "pytorch",
        programs=("torchrun",),
        modules=("torch.distributed.run", "torch.distributed.launch"),
    ),
    EngineRule(
        "deepspeed",
        TRAINING,
        "pytorch",
        programs=("deepspeed",),
        modules=("deepspeed.launcher",),
        flags=("--deepspeed", "--deepspeed_config"),
        images=(_repo("deepspeed/deepspeed"),),
    ),
    EngineRule(
        "accelerate",
        TRAINING,
        "pytorch",
        programs=("accelerate launch",),
        modules=("accelerate.commands.launch",),
    ),
    EngineRule("megatron", TRAINING, "pytorch", scripts=(r"pretrain_\w+\.py",)),
    EngineRule(
        "nemo",
        TRAINING,
        "pytorch",
        programs=("nemo llm",),
        scripts=(r"megatron_\w+_(pretraining|finetuning|sft)\.py",),
        images=(_repo("nvcr.io/nvidia/nemo"),),
    ),
    EngineRule(
        "horovod",
        TRAINING,
        None,
        programs=("horovodrun",),
        images=(_repo("horovod/horovod"),),
    ),
    EngineRule(
        "lightning",
        TRAINING,
        "pytorch",
        programs=("lightning run", "fabric run"),
        images=(r"(^|/)pytorchlightning/",),
    ),
    EngineRule(
        "maxtext",
        TRAINING,
        "jax",
        modules=("MaxText.train",),
        images=(r"(^|/)ghcr\.io/nvidia/jax:maxtext",),
    ),
    # Ray runs training and serving alike: the name only (RayJob / RayService owners decide).
    EngineRule(
        "ray",
        None,
        None,
        programs=("ray start",),
        images=(r"(^|/)rayproject/ray(-ml)?(:|$)",),
    ),
)

FRAMEWORKS: tuple[FrameworkRule, ...] = (
    FrameworkRule(
        "pytorch",
        images=(r"(^|/)[^:]*pytorch",),
        libraries=(r"libtorch_cuda(_cu)?\.so", r"libc10_cuda\.so"),
    ),
    FrameworkRule(
        "tensorflow",
        images=(r"(^|/)[^:]*tensorflow",),
        libraries=(r"libtensorflow_framework\.so", r"libtensorflow_cc\.so"),
    ),
    FrameworkRule(
        "jax",
        images=(r"(^|/)nvcr\.io/nvidia/jax(:|$)", r"(^|/)ghcr\.io/nvidia/jax(:|$)"),
        libraries=(r"xla_extension\.so", r"/jaxlib/"),
    ),
    FrameworkRule("paddle", images=(r"(^|/)paddlepaddle/",), libraries=(r"libpaddle\.so",)),
    FrameworkRule("onnxruntime", libraries=(r"libonnxruntime_providers_cuda\.so",)),
    FrameworkRule("tensorrt", libraries=(r"libnvinfer\.so",)),
    FrameworkRule("ggml", libraries=(r"libggml[-\w]*\.so",)),
)

ENGINE_NAMES = tuple(rule.name for rule in ENGINES)
# Labels local sampling puts on a GPU's series: what its main process runs.
ENGINE_LABEL, FRAMEWORK_LABEL = "engine", "framework"
FRAMEWORK_NAMES = tuple(rule.name for rule in FRAMEWORKS)


@dataclass(frozen=True)
class ContainerSpec:
    """What a pod's container declares: image, command and args, GPUs requested."""

    image: str
    command: tuple[str, ...] = ()
    args: tuple[str, ...] = ()
    gpus: int = 0


# Commands run through a shell (``sh -c "vllm serve ..."``) are split into their commands.
_SHELLS = frozenset({"sh", "bash", "dash", "ash", "zsh"})
# Programs that run the rest of their arguments as the command.
_WRAPPERS = frozenset(
    {"env", "exec", "nohup", "time", "stdbuf", "tini", "dumb-init", "catatonit", "numactl"}
)
_PYTHON = re.compile(r"^python(\d+(\.\d+)*)?$")
_PYTHON_OPTIONS_WITH_VALUE = frozenset({"-X", "-W", "-Q"})
_SEPARATORS = frozenset({";", "&&", "||", "|", "&", "(", ")"})
_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


@dataclass(frozen=True)
class _Command:
    """One command, reduced to what the rules match on."""

    program: str  # base name of the executable
    subcommand: str  # its first argument that is not an option ("" for none)
    module: str  # python -m MODULE ("" for none)
    script: str  # base name of the Python script run ("" for none)
    arguments: tuple[str, ...]


def _base(path: str) -> str:
    return path.rstrip("/").rpartition("/")[2]


def _split_shell(script: str) -> list[list[str]]:
    """The simple commands of a shell script (best effort: a script that does not parse is
    split at white space)."""
    try:
        lexer = shlex.shlex(script, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        tokens = list(lexer)
    except ValueError:
        tokens = script.split()
    commands: list[list[str]] = [[]]
    for token in tokens:
        if token in _SEPARATORS or set(token) <= set(";&|()"):
            commands.append([])
        else:
            commands[-1].append(token)
    return [command for command in commands if command]


def _python(words: Sequence[str]) -> tuple[str, str, tuple[str, ...]]:
    """(module, script, arguments) of a Python command line after the interpreter."""
    position = 0
    while position < len(words):
        word = words[position]
        if word == "-m" and position + 1 < len(words):
            return words[position + 1], "", tuple(words[position + 2 :])
        if word == "-c":
            return "", "", tuple(words[position + 2 :])
        if word in _PYTHON_OPTIONS_WITH_VALUE:
            position += 2
            continue
        if word.startswith("-"):
            position += 1
            continue
        return "", _base(word), tuple(words[position + 1 :])
    return "", "", ()


def _commands(words: Sequence[str], depth: int = 0) -> list[_Command]:
    """The commands a command line runs: itself, or the commands of its shell script."""
    words = list(words)
    while words and (_ASSIGNMENT.match(words[0]) or _base(words[0]) in _WRAPPERS):
        wrapper = not _ASSIGNMENT.match(words[0])
        words = words[1:]
        while wrapper and words and words[0].startswith("-"):
            words = words[1:]
    if not words:
        return []
    program = _base(words[0])
    rest = words[1:]
    if program in _SHELLS and "-c" in rest and depth < 2:
        script_at = rest.index("-c") + 1
        if script_at < len(rest):
            found: list[_Command] = []
            for command in _split_shell(rest[script_at]):
                found += _commands(command, depth + 1)
            return found
    if _PYTHON.match(program):
        module, script, arguments = _python(rest)
        return [_Command(program, "", module, script, arguments)]
    subcommand = next((word for word in rest if not word.startswith("-")), "")
    return [_Command(program, subcommand, "", "", tuple(rest))]


def _matches_command(rule: EngineRule, command: _Command) -> bool:
    for entry in rule.programs:
        program, _, subcommand = entry.partition(" ")
        if command.program == program and (not subcommand or command.subcommand == subcommand):
            return True
    for module in rule.modules:
        if command.module == module or command.module.startswith(module + "."):
            return True
    if command.script and any(re.fullmatch(script, command.script) for script in rule.scripts):
        return True
    return any(
        argument == flag or argument.startswith(flag + "=")
        for flag in rule.flags
        for argument in command.arguments
    )


def _image_reference(image: str) -> str:
    return image.strip().lower().partition("@")[0]


def _by_commands(commands: Sequence[_Command]) -> EngineRule | None:
    for rule in ENGINES:
        if any(_matches_command(rule, command) for command in commands):
            return rule
    return None


def _search(patterns: Iterable[str], texts: Sequence[str]) -> bool:
    return any(re.search(pattern, text) for pattern in patterns for text in texts)


def _by_images(images: Sequence[str]) -> EngineRule | None:
    return next((rule for rule in ENGINES if _search(rule.images, images)), None)


def _framework(
    engine: EngineRule | None, images: Sequence[str], libraries: Sequence[str]
) -> str | None:
    """Loaded libraries say it best, then the engine's own framework, then the image."""
    for rule in FRAMEWORKS:
        if _search(rule.libraries, libraries):
            return rule.name
    if engine is not None and engine.framework:
        return engine.framework
    return next((rule.name for rule in FRAMEWORKS if _search(rule.images, images)), None)


def _identity(
    engine: EngineRule | None, images: Sequence[str], libraries: Sequence[str] = ()
) -> Identity | None:
    framework = _framework(engine, images, libraries)
    if engine is None and framework is None:
        return None
    return Identity(engine.name if engine else None, framework, engine.role if engine else None)


def identify_container(container: ContainerSpec) -> Identity | None:
    """The engine and framework one container declares, or None when nothing is known."""
    commands = _commands([*container.command, *container.args])
    images = [_image_reference(container.image)] if container.image else []
    engine = _by_commands(commands) or _by_images(images)
    return _identity(engine, images)


def identify_pod(containers: Sequence[ContainerSpec]) -> Identity | None:
    """A pod's identity: that of its first container requesting GPUs that tells one (sidecars
    say nothing about the GPU), else of its first container that tells one."""
    with_gpus = [container for container in containers if container.gpus > 0]
    for group in (with_gpus, containers):
        for container in group:
            found = identify_container(container)
            if found is not None and (found.engine or found.framework):
                return found
    return None


def identify_process(
    lineage: Sequence[Sequence[str]], libraries: Sequence[str] = ()
) -> Identity | None:
    """A process's identity from its command line and its parents' (``lineage``, the process
    first: torchrun's workers run plain ``python train.py``) and the paths it has mapped."""
    own = _commands(lineage[0]) if lineage else []
    engine = _by_commands(own)
    if engine is None:
        engine = next((rule for rule in ENGINES if _search(rule.libraries, libraries)), None)
    if engine is None:
        engine = _by_commands([command for words in lineage[1:] for command in _commands(words)])
    return _identity(engine, (), libraries)


def identity_of(engine: str | None, framework: str | None) -> Identity | None:
    """An identity from names (series labels): unknown names are ignored, so label values stay
    within the tables."""
    rule = next((rule for rule in ENGINES if rule.name == engine), None)
    known_framework = framework if framework in FRAMEWORK_NAMES else None
    if rule is None and known_framework is None:
        return None
    return Identity(rule.name if rule else None, known_framework, rule.role if rule else None)
