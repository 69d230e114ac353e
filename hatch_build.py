"""Build hook (hatchling): compile sim5d's two C modules, the flow network's max-min kernel
(sim/network/_maxmin.c) and the per-record loops of `sim5d run`'s largest outputs
(sim/engine/_textout.c).

Both are optional: where no C compiler is found the build says so and the package runs its
Python instead (the same rates bit for bit, 10-100x slower on thousands of flows; the same
output bytes, slower on a large step; `sim.network.flow.KERNEL` and
`sim.engine.slice_args.TEXT` tell which one runs). Both a wheel and an editable install get each compiled module next to its
source, e.g. sim/network/_maxmin.<platform suffix>.

`-ffp-contract=off` (`/fp:strict` on MSVC) keeps each multiply and add rounded on its own, as
numpy rounds them: a fused multiply-add would change the last bit of some rates.
"""

from __future__ import annotations

import os
import sys

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

MODULES = {"sim.network._maxmin": ("sim/network/_maxmin.c", "the flow network's compiled max-min kernel",
                                    "the numpy filling (the same results, slower on thousands of "
                                    "concurrent flows)"),
           "sim.engine._textout": ("sim/engine/_textout.c", "the outputs' compiled loops",
                                   "the Python writers (the same files, slower on a large step)")}
"""module -> (its C source, what it is, what runs without it)"""


def compile_kernel(root: str, module: str = "sim.network._maxmin") -> str:
    """Build the extension `module` in place under `root`; the path of the built module, relative."""
    from setuptools import Distribution, Extension
    from setuptools.command.build_ext import build_ext

    flags = ["/O2", "/fp:strict"] if sys.platform == "win32" else ["-O3", "-ffp-contract=off"]
    ext = Extension(module, [MODULES[module][0]], extra_compile_args=flags)
    here = os.getcwd()
    os.chdir(root)
    try:
        cmd = build_ext(Distribution({"name": "sim5d-kernel", "ext_modules": [ext]}))
        cmd.inplace = True
        cmd.ensure_finalized()
        cmd.run()
        return os.path.relpath(cmd.get_ext_fullpath(module), root)
    finally:
        os.chdir(here)


class KernelHook(BuildHookInterface):
    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict) -> None:
        for module, (_, what, instead) in MODULES.items():
            try:
                built = compile_kernel(self.root, module)
            except Exception as exc:        # no compiler, no headers: the Python runs
                self.app.display_warning(f"sim5d: {what} was not built ({type(exc).__name__}: {exc}); "
                                         f"it runs {instead} instead")
                continue
            build_data["pure_python"] = False
            build_data["infer_tag"] = True
            build_data["artifacts"].append(built.replace(os.sep, "/"))
