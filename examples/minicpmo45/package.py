"""Import the model submodules of PyPI ``stepaudio2-minicpmo`` 0.1.1 without its front end.

MiniCPM-o 4.5 turns speech tokens into audio with ``stepaudio2.Token2wav`` from the package
``stepaudio2-minicpmo`` (0.1.1). The package ``__init__`` imports ``Token2wav`` together with the
whole front end (torchaudio, s3tokenizer, librosa, hyperpyyaml, transformers through
``stepaudio2.stepaudio2``), which pins torch versions that cannot live beside the torch this
project runs on. The streaming tail itself, ``Token2wav.stream`` and the modules it drives, needs
only torch, numpy, scipy, einops and onnxruntime (``flow_matching.py`` imports onnxruntime and
never uses it).

:func:`load_stepaudio2` therefore

1. registers a bare package object named ``stepaudio2`` in ``sys.modules`` whose ``__path__`` is the
   installed package folder, so its submodules import normally while ``stepaudio2/__init__.py``
   never runs;
2. imports the flow (``cosyvoice2.flow.flow``, ``flow_matching``, ``decoder_dit``,
   ``cosyvoice2.transformer.upsample_encoder_v2``) and HiFT (``flashcosyvoice.modules.hifigan``)
   submodules unmodified;
3. imports ``stepaudio2.token2wav`` unmodified with stand-in modules, present only for the duration
   of that import, for the front-end names it imports at module level but that ``Token2wav.stream``
   never touches (``torchaudio``, ``torchaudio.compliance.kaldi``, ``s3tokenizer``,
   ``hyperpyyaml``, and ``stepaudio2.flashcosyvoice.utils.audio``, which needs librosa). A name
   already in ``sys.modules`` is used as it is. Any use of a stand-in raises
   :class:`FrontEndUnavailableError`, so ``Token2wav.__init__`` / ``_prepare_prompt`` /
   ``__call__`` fail loudly instead of silently;
4. restores the global side effect of ``upsample_encoder_v2.py``: importing it sets
   ``torch._dynamo.config.suppress_errors = True`` and ``cache_size_limit = 128`` for the whole
   process. In this package the ``@torch.compile`` on ``forward_chunk`` is commented out, so the
   settings have no effect on the tail; they are put back to their previous values (the loaded
   ``torch._dynamo`` module itself stays imported). The values the package would have set are
   kept in :data:`PACKAGE_DYNAMO_SETTINGS`.

If the real ``stepaudio2`` package was already imported in this process (a machine with the full
front end), its modules are used as they are and nothing is registered or restored.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types
from dataclasses import dataclass
from typing import Any

PACKAGE_NAME = "stepaudio2"
DISTRIBUTION = "stepaudio2-minicpmo"
DISTRIBUTION_VERSION = "0.1.1"

#: The ``torch._dynamo.config`` values that ``stepaudio2/cosyvoice2/transformer/upsample_encoder_v2.py``
#: assigns at import time (restored to the previous values by :func:`load_stepaudio2`).
PACKAGE_DYNAMO_SETTINGS: dict[str, Any] = {"suppress_errors": True, "cache_size_limit": 128}

MODEL_SUBMODULES = (
    "stepaudio2.cosyvoice2.flow.decoder_dit",
    "stepaudio2.cosyvoice2.flow.flow_matching",
    "stepaudio2.cosyvoice2.transformer.upsample_encoder_v2",
    "stepaudio2.cosyvoice2.flow.flow",
    "stepaudio2.flashcosyvoice.modules.hifigan",
    "stepaudio2.flashcosyvoice.modules.hifigan_components.layers",
)

#: Modules imported at the top of ``stepaudio2/token2wav.py`` that only the prompt front end uses.
FRONT_END_MODULES = (
    "torchaudio",
    "torchaudio.compliance",
    "torchaudio.compliance.kaldi",
    "s3tokenizer",
    "hyperpyyaml",
    "stepaudio2.flashcosyvoice.utils.audio",
)


class FrontEndUnavailableError(RuntimeError):
    """Raised when code reaches a front-end stand-in (prompt audio loading, tokenizer, speaker model)."""


class FrontEndStandIn(types.ModuleType):
    """A module object standing in for a front-end module: every unknown attribute raises on use."""

    def __getattr__(self, attribute: str) -> Any:
        if attribute.startswith("__"):
            raise AttributeError(attribute)
        module_name = self.__name__

        def unavailable(*args: Any, **kwargs: Any) -> Any:
            raise FrontEndUnavailableError(
                f"{module_name}.{attribute} is a stand-in: the Token2wav front end (prompt audio, "
                f"s3tokenizer, speaker model) is not loaded; only Token2wav.stream is usable"
            )

        unavailable.__name__ = attribute
        return unavailable


@dataclass(frozen=True)
class StepAudio2Modules:
    """Handles on the package's own model modules (imported unmodified)."""

    flow: types.ModuleType
    """``stepaudio2.cosyvoice2.flow.flow`` (``CausalMaskedDiffWithXvec``)."""
    flow_matching: types.ModuleType
    """``stepaudio2.cosyvoice2.flow.flow_matching`` (``CausalConditionalCFM``)."""
    decoder_dit: types.ModuleType
    """``stepaudio2.cosyvoice2.flow.decoder_dit`` (``DiT``, ``TimestepEmbedder``)."""
    upsample_encoder_v2: types.ModuleType
    """``stepaudio2.cosyvoice2.transformer.upsample_encoder_v2`` (``UpsampleConformerEncoderV2``)."""
    hifigan: types.ModuleType
    """``stepaudio2.flashcosyvoice.modules.hifigan`` (``HiFTGenerator``)."""
    hifigan_layers: types.ModuleType
    """``stepaudio2.flashcosyvoice.modules.hifigan_components.layers`` (``SineGen2``)."""
    token2wav: types.ModuleType
    """``stepaudio2.token2wav`` (``Token2wav``, ``fade_in_out``), front-end names bound to stand-ins."""
    package_dir: str
    """Folder of the installed ``stepaudio2`` package."""
    bare_package: bool
    """True when :func:`load_stepaudio2` registered the bare package object (front end not imported)."""


_loaded: StepAudio2Modules | None = None


def is_installed() -> bool:
    """Whether the ``stepaudio2`` package can be found (without importing anything)."""
    return PACKAGE_NAME in sys.modules or importlib.util.find_spec(PACKAGE_NAME) is not None


def _register_bare_package() -> str:
    spec = importlib.util.find_spec(PACKAGE_NAME)
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(
            f"{PACKAGE_NAME} is not installed: pip install --no-deps {DISTRIBUTION}=={DISTRIBUTION_VERSION}"
        )
    package_dir = next(iter(spec.submodule_search_locations))
    package = types.ModuleType(PACKAGE_NAME, "stepaudio2 model submodules (package __init__ not executed)")
    package.__path__ = list(spec.submodule_search_locations)
    package.__file__ = spec.origin
    package.__package__ = PACKAGE_NAME
    package.__spec__ = spec
    sys.modules[PACKAGE_NAME] = package
    return package_dir


def _import_model_submodules() -> dict[str, types.ModuleType]:
    import torch._dynamo

    dynamo_config = torch._dynamo.config
    previous = {name: getattr(dynamo_config, name) for name in PACKAGE_DYNAMO_SETTINGS}
    try:
        return {name: importlib.import_module(name) for name in MODEL_SUBMODULES}
    finally:
        for name, value in previous.items():
            setattr(dynamo_config, name, value)


def _import_token2wav() -> types.ModuleType:
    name = "stepaudio2.token2wav"
    if name in sys.modules:
        return sys.modules[name]
    installed: list[str] = []
    for module_name in FRONT_END_MODULES:
        if module_name not in sys.modules:
            sys.modules[module_name] = FrontEndStandIn(module_name, "front-end stand-in")
            installed.append(module_name)
    # `import torchaudio.compliance.kaldi as kaldi` walks the attributes of the parents.
    for parent_name, child in (("torchaudio", "compliance"), ("torchaudio.compliance", "kaldi")):
        if parent_name in installed:
            setattr(sys.modules[parent_name], child, sys.modules[f"{parent_name}.{child}"])
    try:
        return importlib.import_module(name)
    finally:
        for module_name in installed:
            del sys.modules[module_name]


def load_stepaudio2() -> StepAudio2Modules:
    """Import the package's flow / DiT / HiFT / token2wav modules without its ``__init__``.

    Idempotent. Raises ``ModuleNotFoundError`` when the package is not installed.
    """
    global _loaded
    if _loaded is not None:
        return _loaded
    bare_package = PACKAGE_NAME not in sys.modules
    if bare_package:
        package_dir = _register_bare_package()
    else:
        package_dir = next(iter(sys.modules[PACKAGE_NAME].__path__))
    modules = _import_model_submodules()
    token2wav = _import_token2wav()
    _loaded = StepAudio2Modules(
        flow=modules["stepaudio2.cosyvoice2.flow.flow"],
        flow_matching=modules["stepaudio2.cosyvoice2.flow.flow_matching"],
        decoder_dit=modules["stepaudio2.cosyvoice2.flow.decoder_dit"],
        upsample_encoder_v2=modules["stepaudio2.cosyvoice2.transformer.upsample_encoder_v2"],
        hifigan=modules["stepaudio2.flashcosyvoice.modules.hifigan"],
        hifigan_layers=modules["stepaudio2.flashcosyvoice.modules.hifigan_components.layers"],
        token2wav=token2wav,
        package_dir=package_dir,
        bare_package=bare_package,
    )
    return _loaded
