"""Run after `pip install .`: the installed package (not the source tree) imports, ships libcad_host and the
plugins, and computes attention locally and through a one-rank CAD plan. Exit status 0 on success."""
import pathlib
import sys

import torch

import cad
from cad import _lib

package = pathlib.Path(cad.__file__).resolve().parent
assert "site-packages" in str(package) or "dist-packages" in str(package), f"not the installed package: {package}"
assert _lib.library_path().is_file(), _lib.library_path()
plugins = sorted(p.name for p in (package / "lib" / "cad" / "plugins").glob("cad_*.so"))
for needed in ("cad_cad.so", "cad_host.so", "cad_reference.so", "cad_prefix_aware.so"):
    assert needed in plugins, f"{needed} missing from {plugins}"
cu = torch.tensor([0, 3, 10], dtype=torch.int32)
q, k, v = torch.randn(10, 4, 16), torch.randn(10, 2, 16), torch.randn(10, 2, 16)
local = cad.varlen_attn(q, k, v, cu)
through_cad = cad.varlen_attn(q, k, v, cu, plan=cad.plan(cu))
torch.testing.assert_close(local, through_cad)
# The trainers' parts ship as the subpackage cad.train, beside the rest of the package.
from cad.train import recipe  # noqa: E402
assert pathlib.Path(recipe.__file__).resolve().parent == package / "train", recipe.__file__
assert [sum(rank) for rank in recipe.sample_batch([100, 50, 70000], 64, 2, 1)] == [64, 64]  # two full buffers
print(f"installed package OK: {package} ({len(plugins)} plugins: {', '.join(plugins)})")
sys.exit(0)
