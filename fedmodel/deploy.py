"""Deployment across organisations: the shared model file, and each side's view of it.

Every organisation and the coordinator hold the same **model file**, a Python file that
declares the parties and how the model is built from their data, but holds no data:

.. code-block:: python

    # model.py
    import cvxpy as cp
    import numpy as np
    import fedmodel as fm

    PARTIES = ["site0", "site1", "site2"]

    def load(party, path):               # optional; default: the arrays of an .npz file
        return dict(np.load(path))

    def build(data):                      # data[party] = that party's arrays, by name
        model = fm.Model("np")
        w = model.variable(5, name="w")
        for name in PARTIES:
            site = model.client(name)
            X0 = site.data(data[name]["X0"], name="class0")
            ...
        return model

``build(data)`` must give each party terms that depend on its own data only. A party's
process (``fedmodel join``) calls it with its own arrays and, for every other party,
**stand-ins** (zeros of its own arrays' shapes: it never sees the others' data, and the
others' files are absent there); it keeps only its own compiled program. The coordinator
(``fedmodel serve``) calls it with stand-ins of the shapes each party reported when it
joined (shapes only, never values); it runs the method's server half, which never reads
a client's data.

Examples
--------
>>> import numpy as np
>>> stand_ins({"X0": (3, 2)})["X0"].shape
(3, 2)
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import Any, NamedTuple

import numpy as np

from fedmodel.errors import ModelError


@dataclass
class ModelFile:
    """A loaded model file: its parties, data loader and builder."""

    path: str
    module: ModuleType

    @property
    def parties(self) -> list[str]:
        parties = getattr(self.module, "PARTIES", None)
        if not isinstance(parties, (list, tuple)) or not all(isinstance(p, str) for p in parties):
            raise ModelError(f"{self.path}: PARTIES must be a list of party names")
        return list(parties)

    def load(self, party: str, path: str) -> dict[str, np.ndarray]:
        """Party ``party``'s arrays from ``path`` (the file's ``load``, or an ``.npz``)."""
        if party not in self.parties:
            raise ModelError(f"{self.path} declares no party '{party}' (PARTIES = {self.parties})")
        loader = getattr(self.module, "load", None)
        if loader is None:
            with np.load(path, allow_pickle=False) as f:
                data = {k: np.asarray(f[k]) for k in f.files}
        else:
            data = loader(party, path)
        if not isinstance(data, Mapping) or not data:
            raise ModelError(f"{self.path}: load({party!r}, ...) must return a dict of arrays")
        return {str(k): np.asarray(v) for k, v in data.items()}

    def build(self, data: Mapping[str, Mapping[str, np.ndarray]]):
        builder = getattr(self.module, "build", None)
        if builder is None:
            raise ModelError(f"{self.path} has no build(data) function")
        model = builder(dict(data))
        from fedmodel.dsl.model import Model

        if not isinstance(model, Model):
            raise ModelError(f"{self.path}: build(data) must return a fedmodel.Model")
        names = [c.name for c in model.clients]
        if names != self.parties:
            raise ModelError(
                f"{self.path}: build(data) made clients {names}, PARTIES says {self.parties}"
            )
        return model


def load_model_file(path: str | os.PathLike) -> ModelFile:
    """Import a model file (see the module docstring)."""
    path = os.path.abspath(os.fspath(path))
    if not os.path.isfile(path):
        raise ModelError(f"model file {path!r} not found")
    name = "fedmodel_model_" + str(abs(hash(path)))
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return ModelFile(path, module)


def shapes_of(data: Mapping[str, np.ndarray]) -> dict[str, list[int]]:
    """What a party reports when it joins: the shape of each of its arrays."""
    return {k: list(np.shape(v)) for k, v in data.items()}


def stand_ins(shapes: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """Zeros of the given shapes, in place of data this process does not have."""
    return {k: np.zeros(tuple(int(s) for s in v)) for k, v in shapes.items()}


class _ReadRecorder(Mapping):
    """One party's arrays as ``build`` sees them, noting the names it reads (iterating
    over the names, e.g. ``dict(data[p])``, counts as reading all of them)."""

    def __init__(self, arrays: Mapping[str, np.ndarray], read: set[str]):
        self._arrays = arrays
        self._read = read

    def __getitem__(self, name: str) -> np.ndarray:
        value = self._arrays[name]
        self._read.add(name)
        return value

    def __contains__(self, name: object) -> bool:
        return name in self._arrays

    def __iter__(self):
        self._read.update(self._arrays)
        return iter(self._arrays)

    def __len__(self) -> int:
        return len(self._arrays)


class PartyBuild(NamedTuple):
    """What a party compiles from the model file and its own data (see
    :func:`party_compiled`)."""

    program: Any
    regularizer: Any
    used: tuple[str, ...]  # the names of the party's arrays the model reads
    compiled: Any = None  # the whole model as the party compiled it (others: stand-ins)


def party_program(model_file: ModelFile, party: str, data: Mapping[str, np.ndarray]):
    """Compile ``party``'s own program from its data (others: stand-ins of its shapes)."""
    return party_compiled(model_file, party, data).program


def party_compiled(model_file: ModelFile, party: str, data: Mapping[str, np.ndarray]) -> PartyBuild:
    """``party``'s own compiled program, the model's regularizer (compiled where the party
    runs; the others' data: stand-ins of its shapes) and the names of the arrays the
    model file's ``build`` reads: only those are reported when the party joins.

    Examples
    --------
    >>> import os, tempfile, textwrap
    >>> path = os.path.join(tempfile.mkdtemp(), "model.py")
    >>> _ = open(path, "w").write(textwrap.dedent('''
    ...     import cvxpy as cp
    ...     import fedmodel as fm
    ...     PARTIES = ["site0", "site1"]
    ...     def build(data):
    ...         model = fm.Model("ls")
    ...         w = model.variable(2, name="w")
    ...         for name in PARTIES:
    ...             site = model.client(name)
    ...             A = site.data(data[name]["X0"] + data[name]["X1"], name="rows")
    ...             site.minimize(cp.sum_squares(A @ w - 1))
    ...         return model
    ... '''))
    >>> own = {"X0": np.eye(2), "X1": np.ones((2, 2)), "notes": np.zeros(3)}
    >>> party_compiled(load_model_file(path), "site0", own).used  # "notes" is never read
    ('X0', 'X1')
    """
    own = shapes_of(data)
    read: set[str] = set()
    full = {
        p: _ReadRecorder(dict(data) if p == party else stand_ins(own), read)
        for p in model_file.parties
    }
    compiled = model_file.build(full).compile()
    for c in compiled.clients:
        if c.name == party:
            used = tuple(k for k in data if k in read)
            return PartyBuild(c, compiled.regularizer, used, compiled)
    raise ModelError(f"the model has no client '{party}'")  # pragma: no cover


def join_info(party: str, data: Mapping[str, np.ndarray], used: tuple[str, ...]) -> dict:
    """What a party's ``hello`` says when it joins: its name and the shapes of the arrays
    the model reads (``used``), never their values and nothing about the other arrays of
    its file.

    Examples
    --------
    >>> info = join_info("site0", {"X0": np.zeros((4, 2)), "ids": np.zeros(4)}, ("X0",))
    >>> info["shapes"]
    {'site0': {'X0': [4, 2]}}
    """
    return {"shapes": {party: shapes_of({k: data[k] for k in used})}}


def coordinator_model(model_file: ModelFile, shapes: Mapping[str, Mapping[str, Any]]):
    """The model as the coordinator sees it: every party's data replaced by stand-ins of
    the shapes the party reported."""
    missing = [p for p in model_file.parties if p not in shapes]
    if missing:
        raise ModelError(f"parties {missing} have not joined")
    return model_file.build({p: stand_ins(shapes[p]) for p in model_file.parties})
