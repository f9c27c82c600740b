"""A package's methods besides forward (`@torch.jit.export def encode(self, x)`): each converted on its own into a
plan with its signature, kernels and weights, stored in the one package under manifest["methods"][name], its
weights and files named under `methods/<name>/`. A method loads as a package of its own (`method_contents`),
whose manifest is the package's shared fields (format, producer, device, model) and the method's own. Conversion
stores them (deploy/packaging/build_manifest.py's add_method)."""
from __future__ import annotations

from jit2triton.errors import CorruptPackageError

from .package import PackageContents
from .policy import METHOD_PREFIX, METHOD_SHARED_FIELDS, RECONVERT


def method_names(manifest: dict) -> list[str]:
    methods = manifest.get("methods") or {}
    if not isinstance(methods, dict):
        raise CorruptPackageError("the package's methods are damaged; " + RECONVERT)
    return list(methods)


def method_contents(contents: PackageContents, name: str) -> PackageContents:
    """Method `name` of a loaded package, as a package of its own that the runtimes load like forward's."""
    own = contents.manifest["methods"][name]
    if not isinstance(own, dict):
        raise CorruptPackageError(f"the package's method {name!r} is damaged; {RECONVERT}")
    prefix = f"{METHOD_PREFIX}{name}/"
    manifest = {k: contents.manifest[k] for k in METHOD_SHARED_FIELDS if k in contents.manifest}
    manifest.update(own)
    return PackageContents(manifest,
                           {k[len(prefix):]: w for k, w in contents.weights.items() if k.startswith(prefix)},
                           {k[len(prefix):]: d for k, d in contents.files.items() if k.startswith(prefix)},
                           contents.signed)
