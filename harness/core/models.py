"""timm Vision Transformers exposed as an ordered list of partitionable layers.

Every strategy builds from the same list: ``[embedding, block_0, ..., block_{d-1},
head]``. Running the layers one after another gives exactly the timm model's
output (tests check it), so a pipeline stage is simply a contiguous slice of
the list. Model code never talks to the network or to other processes. ``cfg`` is
the run config's ``model`` node (:class:`harness.config.schema.ModelConfig`); this
module only reads its fields.
"""

from __future__ import annotations

import contextlib
import os
import zipfile

import torch
import torch.nn.functional as F
from torch import nn

from harness.core.checkpoints import checkpoint_folder
from harness.core.errors import ConfigError


class Embedding(nn.Module):
    """Patch embedding, class token, position embedding and pre-norm of a timm ViT.

    Inputs whose size differs from the model's ``img_size`` (CIFAR's 32x32 for
    ViT-H/14 at 224) are resized here, so data loading stays model-agnostic.
    The token logic is timm's default ViT layout (class token, position
    embedding that includes it); :func:`build_timm_vit` only builds that layout.
    """

    def __init__(self, vit: nn.Module, img_size: int):
        super().__init__()
        self.img_size = img_size
        self.patch_embed = vit.patch_embed
        self.cls_token = vit.cls_token
        self.pos_embed = vit.pos_embed
        self.pos_drop = vit.pos_drop
        self.patch_drop = vit.patch_drop
        self.norm_pre = vit.norm_pre

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] != self.img_size or x.shape[-2] != self.img_size:
            x = F.interpolate(x, size=(self.img_size, self.img_size), mode="bilinear", align_corners=False)
        x = self.patch_embed(x)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1)
        x = self.pos_drop(x + self.pos_embed)
        x = self.patch_drop(x)
        return self.norm_pre(x)


class Head(nn.Module):
    """Final norm, class-token pooling and classifier of a timm ViT."""

    def __init__(self, vit: nn.Module):
        super().__init__()
        self.norm = vit.norm
        self.fc_norm = vit.fc_norm
        self.head_drop = vit.head_drop
        self.head = vit.head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.norm(x)[:, 0]
        return self.head(self.head_drop(self.fc_norm(x)))


def build_timm_vit(cfg) -> nn.Module:
    # timm (with torchvision) takes about 2 s to import here: only what builds a model pays for it,
    # not the commands that check a configuration or read records
    from timm.models.vision_transformer import VisionTransformer

    return VisionTransformer(
        img_size=cfg.img_size,
        patch_size=cfg.patch_size,
        embed_dim=cfg.embed_dim,
        depth=cfg.depth,
        num_heads=cfg.num_heads,
        mlp_ratio=cfg.mlp_ratio,
        num_classes=cfg.num_classes,
        qkv_bias=cfg.qkv_bias,
        global_pool="token",
        class_token=True,
        no_embed_class=False,
        reg_tokens=0,
        dynamic_img_size=False,
    )


def build_layers(cfg, seed: int) -> list[nn.Module]:
    """The model as partitionable layers, initialised identically for a given seed.

    Every strategy calls this on every rank with the same seed, so all start from
    the same weights whatever the layout.
    """
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        vit = build_timm_vit(cfg)
    layers = _layers_of(vit, cfg)
    if getattr(cfg, "pretrained", None) and not next(vit.parameters()).is_meta:  # shapes only on meta
        params = _keyed(layers)
        with torch.no_grad():
            for key, tensor in pretrained_weights(cfg).items():
                params[key].copy_(tensor)
    return layers


def _layers_of(vit: nn.Module, cfg) -> list[nn.Module]:
    return [Embedding(vit, cfg.img_size), *vit.blocks, Head(vit)]


def _keyed(layers: list[nn.Module]) -> dict[str, nn.Parameter]:
    """Every parameter keyed ``"<layer index>.<name>"``, as checkpoints name them."""
    return {f"{i}.{n}": p for i, layer in enumerate(layers) for n, p in layer.named_parameters()}


def _timm_names(cfg) -> dict[str, str]:
    """Each parameter's name in the layer list ("<layer>.<name>") -> its name in timm's
    VisionTransformer (its state_dict's keys), from the model built on the meta device."""
    with torch.device("meta"):
        vit = build_timm_vit(cfg)
    timm = {id(p): n for n, p in vit.named_parameters()}
    return {key: timm[id(p)] for key, p in _keyed(_layers_of(vit, cfg)).items()}


# timm's classifier: left at its initialisation where the weights were trained for other classes
_CLASSIFIER = ("head.weight", "head.bias")


def pretrained_weights(cfg) -> dict[str, torch.Tensor]:
    """``model.pretrained``'s weights keyed as the layer list names them ("<layer>.<name>"), memory-
    mapped (read when copied): from a state dict in timm's format, or from every rank's file of a
    checkpoint of this harness (a run directory or its ``checkpoints/step<N>``). A classifier of
    another size is left out (the model keeps its own); anything else missing, unknown or of
    another shape, or a file that cannot be read, is refused in one line naming the file."""
    path = cfg.pretrained
    names, shapes = _timm_names(cfg), parameter_shapes(cfg)
    if os.path.isdir(path):  # a checkpoint of this harness: its ranks' parameters together
        folder = checkpoint_folder(path)
        files = sorted(f for f in os.listdir(folder) if f.startswith("rank") and f.endswith(".pt"))
        loaded = {}
        for f in files:
            state = _load(os.path.join(folder, f))
            if not isinstance(state.get("params"), dict):
                raise ConfigError(f"model.pretrained: {os.path.join(folder, f)} is not a checkpoint of this harness")
            loaded.update(state["params"])
        source = folder
    else:
        state = _load(path)
        unknown = sorted(set(state) - set(names.values()))
        if unknown:
            more = f" (and {len(unknown) - 1} more)" if len(unknown) > 1 else ""
            raise ConfigError(
                f"model.pretrained={path} holds {unknown[0]}{more}, which model={cfg.name} has no "
                "parameter of: it is not a timm VisionTransformer of this model's layout"
            )
        by_timm = {t: k for k, t in names.items()}
        loaded = {by_timm[t]: v for t, v in state.items()}
        source = path
    weights = {}
    for key, shape in shapes.items():
        tensor, timm_name = loaded.get(key), names[key]
        if tensor is not None and tuple(tensor.shape) != shape and timm_name in _CLASSIFIER:
            continue  # trained for another number of classes
        if tensor is None or tuple(tensor.shape) != shape:
            held = "no such weight" if tensor is None else f"shape {tuple(tensor.shape)}"
            raise ConfigError(
                f"model.pretrained={source} has {held} for {timm_name} where model={cfg.name} has "
                f"shape {shape}: point it at weights of this model"
            )
        weights[key] = tensor
    return weights


def _load(path: str) -> dict:
    if not os.path.exists(path):
        raise ConfigError(
            f"model.pretrained={path} does not exist: point it at a state dict in timm's format or a "
            "run directory written with train.checkpoint_every>0"
        )
    if not zipfile.is_zipfile(path):
        raise ConfigError(
            f"model.pretrained={path} cannot be read: not a whole file written by torch.save (cut "
            "short, or another format)"
        )
    try:
        state = torch.load(path, map_location="cpu", mmap=True, weights_only=True)
    except Exception as e:  # truncated, zeroed, not a torch archive, ...
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ConfigError(f"model.pretrained={path} cannot be read ({first[:200]})") from None
    if not isinstance(state, dict) or not all(isinstance(k, str) for k in state):
        raise ConfigError(f"model.pretrained={path} is not a state dict (name -> tensor)")
    return state


def num_layers(cfg) -> int:
    """Length of :func:`build_layers`'s list, known without building the model."""
    return cfg.depth + 2


def parameter_shapes(cfg) -> dict[str, tuple[int, ...]]:
    """Every parameter's shape keyed ``"<layer index>.<name>"`` (as checkpoints name them), from the
    model built on the meta device (no memory)."""
    with torch.device("meta"):
        layers = build_layers(cfg, seed=0)
    return {key: tuple(p.shape) for key, p in _keyed(layers).items()}


def count_parameters(layers: list[nn.Module]) -> int:
    return sum(p.numel() for layer in layers for p in layer.parameters())


def activation_shapes(cfg, image_shape: tuple[int, ...] = (3, 32, 32)) -> list[tuple[int, ...]]:
    """Per-sample output shape of every layer, from a forward on the meta device (no memory, no compute)."""
    with torch.device("meta"):
        layers = build_layers(cfg, seed=0)
        x = torch.empty((1, *image_shape), device="meta")
        shapes = []
        for layer in layers:
            x = layer(x)
            shapes.append(tuple(x.shape[1:]))
    return shapes


@contextlib.contextmanager
def visiting(layers: list[nn.Module], device: torch.device):
    """``layers`` on ``device`` for a measurement, then back where they were, the device's cache
    emptied: a rank that measures or plans keeps no copy of layers it does not train."""
    homes = [next(layer.parameters()).device for layer in layers]
    for layer in layers:
        layer.to(device)
    try:
        yield layers
    finally:
        for layer, home in zip(layers, homes):
            layer.to(home)
        if device.type == "cuda":
            torch.cuda.empty_cache()
