"""The ``flwr-clientapp`` of a deployed fedmodel party: Flower's own, minus the FAB's code.

Flower's deployment engine runs, for every message, the ClientApp *shipped by the
coordinator* in its FAB (Flower App Bundle): ``flwr-clientapp`` installs the FAB and imports
its ClientApp module (and may install its dependencies). A party that ran that code would
let the coordinator run anything as the party's user: read its data, its key, bypass the
codec's closed registry. So ``fedmodel join`` starts its SuperNode with a ``PATH`` whose
first entry is a private directory (see :func:`write_shim`) holding a ``flwr-clientapp``
that runs this module instead: Flower's own ``flwr-clientapp`` entry point
(:func:`flwr.supernode.cli.flwr_clientapp.flwr_clientapp`) with three of the names its
``run_clientapp`` uses replaced (:func:`install_trusted_hooks`):

* ``install_from_fab``: a no-op (the FAB is never unpacked);
* ``get_load_client_app_fn``: a loader that always gives the relay ClientApp of *this*
  fedmodel installation (``fedmodel/runtime/flower_relay_app.py``, :func:`load_relay_app`),
  whatever the FAB names;
* ``install_app_dependencies``: refuses; runtime dependency installation is forced off.

The coordinator's FAB still carries its relay (``fedmodel serve`` ships one for Flower's
own SuperNodes); a party started with ``fedmodel join`` never runs it. The message,
context and the Flower protocol are Flower's, unchanged.

This file imports only Flower and the standard library (run as a script by the shim, it
does not import the fedmodel package: a ClientApp process starts for every message).

Example
-------
>>> from fedmodel.runtime.trusted_clientapp import load_relay_app
>>> type(load_relay_app()).__name__
'ClientApp'
"""

from __future__ import annotations

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
if __name__ == "__main__" and sys.path and os.path.abspath(sys.path[0] or ".") == _HERE:
    del sys.path[0]  # run as a script: this directory's modules must not shadow others

import importlib.util  # noqa: E402
import shlex  # noqa: E402
from logging import DEBUG  # noqa: E402

#: the relay ClientApp a party runs: the file of this fedmodel installation
RELAY_FILE = os.path.join(_HERE, "flower_relay_app.py")
_RELAY_MODULE = "fedmodel_trusted_relay"
#: the command Flower's SuperExec starts per ClientApp message (looked up on ``PATH``)
CLIENTAPP_COMMAND = "flwr-clientapp"


def load_relay_app():
    """The relay :class:`flwr.clientapp.ClientApp` of this fedmodel installation (loaded
    from :data:`RELAY_FILE`, once per process).

    Example
    -------
    >>> from fedmodel.runtime.trusted_clientapp import load_relay_app
    >>> load_relay_app() is load_relay_app()
    True
    """
    module = sys.modules.get(_RELAY_MODULE)
    if module is None:
        spec = importlib.util.spec_from_file_location(_RELAY_MODULE, RELAY_FILE)
        module = importlib.util.module_from_spec(spec)
        sys.modules[_RELAY_MODULE] = module
        try:
            spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[_RELAY_MODULE]
            raise
    return module.app


def _skip_fab_install(fab_content: bytes, *args, **kwargs) -> None:
    """Replaces Flower's ``install_from_fab``: the FAB is not unpacked, its code never runs."""
    from flwr.supercore import log

    log(
        DEBUG,
        "[fedmodel] the coordinator's FAB (%d bytes) is not installed: this party runs "
        "the relay of its own fedmodel (%s)",
        len(fab_content),
        RELAY_FILE,
    )


def trusted_load_client_app_fn(default_app_ref: str = "", app_path=None, multi_app=True):
    """Replaces Flower's ``get_load_client_app_fn``: the loader it returns ignores the
    FAB's id, version and hash and gives :func:`load_relay_app`'s ClientApp.

    Example
    -------
    >>> from fedmodel.runtime.trusted_clientapp import load_relay_app, trusted_load_client_app_fn
    >>> trusted_load_client_app_fn()("anyone/any-app", "1.0", "0" * 64) is load_relay_app()
    True
    """

    def load(fab_id: str, fab_version: str, fab_hash: str):
        return load_relay_app()

    return load


def _refuse_dependency_install(*args, **kwargs):
    raise RuntimeError(
        "fedmodel party: runtime dependency installation from the coordinator's FAB is refused"
    )


#: the names of Flower's ClientApp process code that :func:`install_trusted_hooks` replaces
HOOKED = ("install_from_fab", "get_load_client_app_fn", "install_app_dependencies")


def install_trusted_hooks() -> dict:
    """Replace, in Flower's ``flwr-clientapp`` process code
    (:mod:`flwr.supernode.runtime.run_clientapp`), the FAB installation, the ClientApp
    loader and the dependency installation (see the module docstring); idempotent.
    Returns what was there before (name -> object), for a process that must put Flower's
    own back (a test; a deployed party's ClientApp process never does).

    Example
    -------
    >>> from flwr.supernode.runtime import run_clientapp
    >>> from fedmodel.runtime.trusted_clientapp import install_trusted_hooks
    >>> before = install_trusted_hooks()
    >>> run_clientapp.get_load_client_app_fn.__name__
    'trusted_load_client_app_fn'
    >>> for name, original in before.items():  # (Flower's own again)
    ...     setattr(run_clientapp, name, original)
    >>> run_clientapp.get_load_client_app_fn.__name__
    'get_load_client_app_fn'
    """
    from flwr.supernode.runtime import run_clientapp as process

    for name in HOOKED:
        if not hasattr(process, name):  # a Flower whose ClientApp process changed
            raise RuntimeError(
                f"fedmodel party: flwr.supernode.runtime.run_clientapp has no {name}; this "
                "Flower version is not supported by fedmodel join's trusted ClientApp"
            )
    before = {name: getattr(process, name) for name in HOOKED}
    process.install_from_fab = _skip_fab_install
    process.get_load_client_app_fn = trusted_load_client_app_fn
    process.install_app_dependencies = _refuse_dependency_install
    return before


def main() -> None:
    """``flwr-clientapp`` with :func:`install_trusted_hooks` and no runtime dependency
    installation (the arguments are Flower's)."""
    install_trusted_hooks()
    # (the package flwr.supernode.cli exports a function of the same name as this module)
    cli = importlib.import_module("flwr.supernode.cli.flwr_clientapp")

    run = cli.run_clientapp

    def run_without_dependency_install(**kwargs):
        kwargs["runtime_dependency_install"] = False
        return run(**kwargs)

    cli.run_clientapp = run_without_dependency_install
    cli.flwr_clientapp()


def write_shim(directory: str) -> str:
    """Write ``directory/flwr-clientapp`` (mode 0700), which runs this file with this
    Python, and, for every other task command of Flower's SuperExec (``flwr-agentapp``,
    ``flwr-serverapp``, ...: a coordinator can make a SuperNode start an AgentApp task
    from its FAB), one that refuses to start. Put ``directory`` first on the SuperNode's
    ``PATH``; returns the ``flwr-clientapp`` shim's path.

    Example
    -------
    >>> import os, tempfile
    >>> from fedmodel.runtime.trusted_clientapp import write_shim
    >>> d = tempfile.mkdtemp()
    >>> os.path.basename(write_shim(d))
    'flwr-clientapp'
    """
    from flwr.supercore.constant import TASK_TYPE_TO_COMMAND

    os.makedirs(directory, mode=0o700, exist_ok=True)
    script = os.path.abspath(__file__)
    for command in sorted(set(TASK_TYPE_TO_COMMAND.values()) - {CLIENTAPP_COMMAND}):
        refusal = (
            f"fedmodel party: refused to start {command} (a task the coordinator's run "
            f"asked for): this party runs only the relay ClientApp of its own fedmodel"
        )
        _write_executable(
            os.path.join(directory, command),
            f"#!/bin/sh\necho {shlex.quote(refusal)} >&2\nexit 1\n",
        )
    path = os.path.join(directory, CLIENTAPP_COMMAND)
    _write_executable(
        path, f'#!/bin/sh\nexec {shlex.quote(sys.executable)} {shlex.quote(script)} "$@"\n'
    )
    return path


def _write_executable(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o700)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    os.chmod(path, 0o700)


if __name__ == "__main__":
    main()
