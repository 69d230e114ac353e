"""Build hook (hatchling): compile the flow network's max-min kernel, sim/network/_maxmin.c.

The kernel is optional: where no C compiler is found the build says so and the package runs the
numpy filling instead (the same rates bit for bit, 10-100x slower on thousands of flows;
`sim.network.flow.KERNEL` tells which one runs). Both a wheel and an editable install get the
compiled module next to its source, sim/network/_maxmin.<platform suffix>.

`-ffp-contract=off` (`/fp:strict` on MSVC) keeps each multiply and add rounded on its own, as
numpy rounds them: a fused multiply-add would change the last bit of some rates.
"""

from __future__ import annotations

import os
import sys

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

SOURCE = "sim/network/_maxmin.c"
MODULE = "sim.network._maxmin"


def compile_kernel(root: str) -> str:
    """Build the extension in place under `root`; the path of the built module, relative."""
    from setuptools import Distribution, Extension
    from setuptools.command.build_ext import build_ext

    flags = ["/O2", "/fp:strict"] if sys.platform == "win32" else ["-O3", "-ffp-contract=off"]
    ext = Extension(MODULE, [SOURCE], extra_compile_args=flags)
    here = os.getcwd()
    os.chdir(root)
    try:
        cmd = build_ext(Distribution({"name": "sim5d-kernel", "ext_modules": [ext]}))
        cmd.inplace = True
        cmd.ensure_finalized()
        cmd.run()
        return os.path.relpath(cmd.get_ext_fullpath(MODULE), root)
    finally:
        os.chdir(here)


class KernelHook(BuildHookInterface):
    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict) -> None:
        try:
            built = compile_kernel(self.root)
        except Exception as exc:            # no compiler, no headers: the numpy filling runs
            self.app.display_warning(f"sim5d: the flow network's compiled max-min kernel was not built "
                                     f"({type(exc).__name__}: {exc}); it runs the numpy filling instead "
                                     "(the same results, slower on thousands of concurrent flows)")
            return
        build_data["pure_python"] = False
        build_data["infer_tag"] = True
        build_data["artifacts"].append(built.replace(os.sep, "/"))
