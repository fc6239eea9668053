"""torchvision's ImageNet classifiers in plain torch.nn (torchvision itself is not needed).

``resnet18``, ``resnet50``, ``mobilenet_v3_small`` and ``efficientnet_b0`` follow torchvision's
``models/resnet.py``, ``mobilenetv3.py``, ``efficientnet.py`` and ``ops/misc.py`` module for
module, so their state dicts are torchvision's, name for name and shape for shape, and the
published ImageNet weights (`zoo/catalogs/torchvision.json`) load with ``strict=True``:

- a ``Conv2dNormActivation`` is a Sequential (convolution without bias, batch norm, activation),
  hence keys like ``features.0.0.weight`` and ``features.0.1.running_mean``;
- a ``SqueezeExcitation`` holds two 1x1 convolutions with bias, ``fc1`` and ``fc2``;
- ResNet's blocks are ``layerN.M`` with ``conv1/bn1/conv2/bn2[/conv3/bn3]`` and a
  ``downsample`` Sequential (1x1 convolution, batch norm) where the shape changes (V1.5: the
  stride sits on the 3x3 convolution).

What differs, none of it in the state dict: ``in_channels`` other than 3 changes the stem's
input width (published weights then no longer fit), ``channels_last`` takes NHWC input, and a
model built on torch's meta device (export loads weights into it) skips the initialisation.
Fresh models use torchvision's own initialisation. EfficientNet's stochastic depth (training
only; identity in eval) is implemented as torchvision's ``StochasticDepth(p, "row")``.

torch is imported when a model is built (`build`), never at import.
"""

from __future__ import annotations

from functools import lru_cache
from types import SimpleNamespace
from typing import Any

VISION_ARCHS = ("resnet18", "resnet50", "mobilenet_v3_small", "efficientnet_b0")
# torchvision's classifier dropout (ResNets have none)
DEFAULT_DROPOUT = {"mobilenet_v3_small": 0.2, "efficientnet_b0": 0.2}


def build(arch: str, num_classes: int = 1000, in_channels: int = 3, dropout: float | None = None,
          channels_last: bool = False) -> Any:
    """The torch.nn.Module of torchvision architecture `arch` (one of `VISION_ARCHS`)."""
    c = _classes()
    p = DEFAULT_DROPOUT.get(arch, 0.0) if dropout is None else float(dropout)
    if arch == "resnet18":
        net = c.ResNet(c.BasicBlock, (2, 2, 2, 2), num_classes, in_channels)
    elif arch == "resnet50":
        net = c.ResNet(c.Bottleneck, (3, 4, 6, 3), num_classes, in_channels)
    elif arch == "mobilenet_v3_small":
        net = c.MobileNetV3Small(num_classes, in_channels, p)
    elif arch == "efficientnet_b0":
        net = c.EfficientNetB0(num_classes, in_channels, p)
    else:
        raise ValueError(f"not a torchvision architecture: {arch!r}")
    net.channels_last = channels_last
    return net


def make_divisible(value: float, divisor: int = 8, min_value: int | None = None) -> int:
    """torchvision's `_make_divisible`: round channels to a multiple of `divisor`, never more than 10% down."""
    min_value = divisor if min_value is None else min_value
    rounded = max(min_value, int(value + divisor / 2) // divisor * divisor)
    return rounded + divisor if rounded < 0.9 * value else rounded


# (expand ratio, kernel, stride, input channels, output channels, layers): EfficientNet-B0's stages
EFFICIENTNET_B0 = ((1, 3, 1, 32, 16, 1), (6, 3, 2, 16, 24, 2), (6, 5, 2, 24, 40, 2), (6, 3, 2, 40, 80, 3),
                   (6, 5, 1, 80, 112, 3), (6, 5, 2, 112, 192, 4), (6, 3, 1, 192, 320, 1))
# (input, kernel, expanded, output, squeeze-excitation, hard-swish, stride): MobileNetV3-Small's blocks
MOBILENET_V3_SMALL = ((16, 3, 16, 16, True, False, 2), (16, 3, 72, 24, False, False, 2),
                      (24, 3, 88, 24, False, False, 1), (24, 5, 96, 40, True, True, 2),
                      (40, 5, 240, 40, True, True, 1), (40, 5, 240, 40, True, True, 1),
                      (40, 5, 120, 48, True, True, 1), (48, 5, 144, 48, True, True, 1),
                      (48, 5, 288, 96, True, True, 2), (96, 5, 576, 96, True, True, 1),
                      (96, 5, 576, 96, True, True, 1))


@lru_cache(maxsize=1)
def _classes() -> SimpleNamespace:
    """Define the torch classes (once), importing torch only now."""
    import math
    from functools import partial

    import torch
    from torch import nn

    def conv_norm_act(cin: int, cout: int, kernel: int = 3, stride: int = 1, groups: int = 1, norm=nn.BatchNorm2d,
                      act=nn.ReLU) -> nn.Sequential:
        """torchvision.ops.Conv2dNormActivation: conv (no bias, "same" padding), norm, activation."""
        layers: list[nn.Module] = [nn.Conv2d(cin, cout, kernel, stride, (kernel - 1) // 2, groups=groups, bias=False),
                                   norm(cout)]
        if act is not None:
            layers.append(act(inplace=True))
        return nn.Sequential(*layers)

    class SqueezeExcitation(nn.Module):
        """torchvision.ops.SqueezeExcitation: pooled scale from two 1x1 convolutions (fc1, fc2)."""

        def __init__(self, channels: int, squeeze: int, act=nn.ReLU, scale=nn.Sigmoid):
            super().__init__()
            self.avgpool = nn.AdaptiveAvgPool2d(1)
            self.fc1 = nn.Conv2d(channels, squeeze, 1)
            self.fc2 = nn.Conv2d(squeeze, channels, 1)
            self.activation = act()
            self.scale_activation = scale()

        def forward(self, x):
            s = self.scale_activation(self.fc2(self.activation(self.fc1(self.avgpool(x)))))
            return s * x

    class Vision(nn.Module):
        """Shared forward: NHWC input permuted first when `channels_last`; `features` → pool → classifier."""

        channels_last = False

        def _input(self, x):
            return x.permute(0, 3, 1, 2) if self.channels_last else x

        def forward(self, x):
            x = self.features(self._input(x))
            return self.classifier(torch.flatten(self.avgpool(x), 1))

    def _initialised(model: nn.Module) -> bool:
        # built on the meta device for loaded weights: nothing to initialise (and nn.init on meta
        # tensors would import torch._dynamo)
        return not next(model.parameters()).is_meta

    class BasicBlock(nn.Module):
        expansion = 1

        def __init__(self, cin: int, planes: int, stride: int = 1, downsample: nn.Module | None = None):
            super().__init__()
            self.conv1 = nn.Conv2d(cin, planes, 3, stride, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(planes)
            self.relu = nn.ReLU(inplace=True)
            self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(planes)
            self.downsample = downsample

        def forward(self, x):
            out = self.relu(self.bn1(self.conv1(x)))
            out = self.bn2(self.conv2(out))
            return self.relu(out + (x if self.downsample is None else self.downsample(x)))

    class Bottleneck(nn.Module):
        expansion = 4

        def __init__(self, cin: int, planes: int, stride: int = 1, downsample: nn.Module | None = None):
            super().__init__()
            self.conv1 = nn.Conv2d(cin, planes, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(planes)
            self.conv2 = nn.Conv2d(planes, planes, 3, stride, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(planes)
            self.conv3 = nn.Conv2d(planes, planes * 4, 1, bias=False)
            self.bn3 = nn.BatchNorm2d(planes * 4)
            self.relu = nn.ReLU(inplace=True)
            self.downsample = downsample

        def forward(self, x):
            out = self.relu(self.bn1(self.conv1(x)))
            out = self.relu(self.bn2(self.conv2(out)))
            out = self.bn3(self.conv3(out))
            return self.relu(out + (x if self.downsample is None else self.downsample(x)))

    class ResNet(Vision):
        """torchvision.models.ResNet (V1.5), layer for layer."""

        def __init__(self, block, layers, num_classes: int = 1000, in_channels: int = 3):
            super().__init__()
            self.conv1 = nn.Conv2d(in_channels, 64, 7, 2, 3, bias=False)
            self.bn1 = nn.BatchNorm2d(64)
            self.relu = nn.ReLU(inplace=True)
            self.maxpool = nn.MaxPool2d(3, 2, 1)
            width = 64
            for i, (planes, blocks) in enumerate(zip((64, 128, 256, 512), layers)):
                stride = 1 if i == 0 else 2
                down = None
                if stride != 1 or width != planes * block.expansion:
                    down = nn.Sequential(nn.Conv2d(width, planes * block.expansion, 1, stride, bias=False),
                                         nn.BatchNorm2d(planes * block.expansion))
                stage = [block(width, planes, stride, down)]
                width = planes * block.expansion
                stage += [block(width, planes) for _ in range(1, blocks)]
                setattr(self, f"layer{i + 1}", nn.Sequential(*stage))
            self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
            self.fc = nn.Linear(width, num_classes)
            if _initialised(self):
                for m in self.modules():
                    if isinstance(m, nn.Conv2d):
                        nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
                    elif isinstance(m, nn.BatchNorm2d):
                        nn.init.ones_(m.weight)
                        nn.init.zeros_(m.bias)

        def forward(self, x):
            x = self.maxpool(self.relu(self.bn1(self.conv1(self._input(x)))))
            x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
            return self.fc(torch.flatten(self.avgpool(x), 1))

    def _init_mobile(model: nn.Module, linear) -> None:
        """torchvision's init for MobileNetV3/EfficientNet: conv kaiming fan_out, BN 1/0, `linear(m)`."""
        if not _initialised(model):
            return
        for m in model.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out")
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)
            elif isinstance(m, nn.Linear):
                linear(m)
                nn.init.zeros_(m.bias)

    class InvertedResidual(nn.Module):
        """MobileNetV3's block: expand (1x1), depthwise, squeeze-excitation, project (1x1, no activation)."""

        def __init__(self, cin: int, kernel: int, expanded: int, cout: int, se: bool, hardswish: bool, stride: int,
                     norm):
            super().__init__()
            act = nn.Hardswish if hardswish else nn.ReLU
            layers: list[nn.Module] = []
            if expanded != cin:
                layers.append(conv_norm_act(cin, expanded, 1, norm=norm, act=act))
            layers.append(conv_norm_act(expanded, expanded, kernel, stride, groups=expanded, norm=norm, act=act))
            if se:
                layers.append(SqueezeExcitation(expanded, make_divisible(expanded // 4), scale=nn.Hardsigmoid))
            layers.append(conv_norm_act(expanded, cout, 1, norm=norm, act=None))
            self.block = nn.Sequential(*layers)
            self.use_res_connect = stride == 1 and cin == cout

        def forward(self, x):
            out = self.block(x)
            return out + x if self.use_res_connect else out

    class MobileNetV3Small(Vision):
        """torchvision.models.mobilenet_v3_small, layer for layer (BN eps 0.001, momentum 0.01)."""

        def __init__(self, num_classes: int = 1000, in_channels: int = 3, dropout: float = 0.2):
            super().__init__()
            norm = partial(nn.BatchNorm2d, eps=0.001, momentum=0.01)
            layers: list[nn.Module] = [conv_norm_act(in_channels, 16, 3, 2, norm=norm, act=nn.Hardswish)]
            layers += [InvertedResidual(*cfg, norm=norm) for cfg in MOBILENET_V3_SMALL]
            layers.append(conv_norm_act(96, 576, 1, norm=norm, act=nn.Hardswish))
            self.features = nn.Sequential(*layers)
            self.avgpool = nn.AdaptiveAvgPool2d(1)
            self.classifier = nn.Sequential(nn.Linear(576, 1024), nn.Hardswish(inplace=True),
                                            nn.Dropout(p=dropout, inplace=True), nn.Linear(1024, num_classes))
            _init_mobile(self, lambda m: nn.init.normal_(m.weight, 0, 0.01))

    class StochasticDepth(nn.Module):
        """torchvision.ops.StochasticDepth(p, "row"): while training, drop whole samples' residual
        branch with probability p (survivors scaled by 1/(1-p)); the identity in eval."""

        def __init__(self, p: float):
            super().__init__()
            self.p = p

        def forward(self, x):
            if not self.training or self.p == 0.0:
                return x
            survival = 1.0 - self.p
            noise = torch.empty((x.shape[0],) + (1,) * (x.ndim - 1), dtype=x.dtype, device=x.device)
            return x * noise.bernoulli_(survival).div_(survival)

    class MBConv(nn.Module):
        """EfficientNet's block: expand (1x1), depthwise, squeeze-excitation (SiLU), project (1x1)."""

        def __init__(self, ratio: int, kernel: int, stride: int, cin: int, cout: int, drop: float):
            super().__init__()
            expanded = make_divisible(cin * ratio)
            layers: list[nn.Module] = []
            if expanded != cin:
                layers.append(conv_norm_act(cin, expanded, 1, act=nn.SiLU))
            layers.append(conv_norm_act(expanded, expanded, kernel, stride, groups=expanded, act=nn.SiLU))
            layers.append(SqueezeExcitation(expanded, max(1, cin // 4), act=partial(nn.SiLU, inplace=True)))
            layers.append(conv_norm_act(expanded, cout, 1, act=None))
            self.block = nn.Sequential(*layers)
            self.stochastic_depth = StochasticDepth(drop)
            self.use_res_connect = stride == 1 and cin == cout

        def forward(self, x):
            out = self.block(x)
            return self.stochastic_depth(out) + x if self.use_res_connect else out

    class EfficientNetB0(Vision):
        """torchvision.models.efficientnet_b0, layer for layer (stochastic depth 0.2 over the blocks)."""

        def __init__(self, num_classes: int = 1000, in_channels: int = 3, dropout: float = 0.2,
                     stochastic_depth: float = 0.2):
            super().__init__()
            layers: list[nn.Module] = [conv_norm_act(in_channels, 32, 3, 2, act=nn.SiLU)]
            total, done = sum(stage[-1] for stage in EFFICIENTNET_B0), 0
            for ratio, kernel, stride, cin, cout, count in EFFICIENTNET_B0:
                blocks = []
                for j in range(count):
                    blocks.append(MBConv(ratio, kernel, stride if j == 0 else 1, cin if j == 0 else cout, cout,
                                         stochastic_depth * done / total))
                    done += 1
                layers.append(nn.Sequential(*blocks))
            layers.append(conv_norm_act(320, 1280, 1, act=nn.SiLU))
            self.features = nn.Sequential(*layers)
            self.avgpool = nn.AdaptiveAvgPool2d(1)
            self.classifier = nn.Sequential(nn.Dropout(p=dropout, inplace=True), nn.Linear(1280, num_classes))
            _init_mobile(self, lambda m: nn.init.uniform_(m.weight, -1.0 / math.sqrt(m.out_features),
                                                         1.0 / math.sqrt(m.out_features)))

    classes = dict(ResNet=ResNet, BasicBlock=BasicBlock, Bottleneck=Bottleneck, MobileNetV3Small=MobileNetV3Small,
                   EfficientNetB0=EfficientNetB0, InvertedResidual=InvertedResidual, MBConv=MBConv,
                   SqueezeExcitation=SqueezeExcitation, StochasticDepth=StochasticDepth)
    for cls in classes.values():
        cls.__module__ = __name__
        cls.__qualname__ = cls.__name__
    return SimpleNamespace(**classes)
