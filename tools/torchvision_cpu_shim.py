"""Let the CUDA-built torchvision wheel import under CPU-only torch.

PyPI's torchvision is built against CUDA torch. Under ``torch==2.13.0+cpu`` its C++
extension cannot load, and ``import torchvision`` then dies while registering meta and
autograd kernels for operators that were never defined (``torchvision::nms does not
exist``); ``lightning`` and ``torchmetrics`` die with it. The pure-Python parts, which the
Hugging Face video processors use, work fine. This module, imported at interpreter start
through a ``.pth`` file that ``make setup`` installs into the venv, answers the import of
those two registration modules with an empty module *only* when torchvision's extension
has no operators. It edits no installed file, so re-installing torchvision cannot undo it,
and it costs nothing at start-up: torch is not imported here.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types

_REGISTRATION_MODULES = ("torchvision._meta_registrations", "torchvision._autograd_registrations")


class _EmptyModuleLoader(importlib.abc.Loader):
    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        return types.ModuleType(spec.name)

    def exec_module(self, module: types.ModuleType) -> None:
        module.__doc__ = "Skipped: torchvision's C++ operators are unavailable with this torch build."


class _SkipRegistrationsWithoutOps(importlib.abc.MetaPathFinder):
    def find_spec(
        self, fullname: str, path: object, target: object = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in _REGISTRATION_MODULES:
            return None
        extension = sys.modules.get("torchvision.extension")
        if extension is None or extension._has_ops():
            return None  # a working torchvision: import the real module
        return importlib.machinery.ModuleSpec(fullname, _EmptyModuleLoader())


if not any(isinstance(finder, _SkipRegistrationsWithoutOps) for finder in sys.meta_path):
    sys.meta_path.insert(0, _SkipRegistrationsWithoutOps())
