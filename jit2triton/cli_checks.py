"""The CLI's boundary: every error as one line (`Group`), and what commands check before doing any work."""
from __future__ import annotations

import os
import sys
import warnings

import click

from jit2triton.deploy.policy import OUTPUTS_DIFFER

from .errors import InputError, Jit2TritonError

_NO_ARGS = getattr(click.exceptions, "NoArgsIsHelpError", ())  # click 8.2 on: `jit2triton` alone shows help
MESSAGE_LIMIT = 600  # characters of an error line: a message that quotes a tensor or a graph is cut here
EXIT_CODES = (f"Exit codes: 0 done; 1 a bug in jit2triton; 2 a mistake in the command or its inputs; {OUTPUTS_DIFFER} "
              "`run --check`: the outputs differ from TorchScript's beyond the tolerance.")


class OutputsDiffer(click.ClickException):
    """A comparison that ran and found the outputs apart: exit code OUTPUTS_DIFFER, so a CI job can tell it from a
    mistyped command."""

    exit_code = OUTPUTS_DIFFER


class Group(click.Group):
    """Every error is one line on stderr and exit code 2 (a bug of ours: one line and exit code 1), never a
    traceback unless `jit2triton --debug ...` asks for it; `--help` and `--version` answer as click does."""

    debug = False

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        if not standalone_mode:  # a caller that handles click's exceptions itself
            return super().main(args, prog_name, complete_var, standalone_mode, **extra)
        Group.debug = False
        with warnings.catch_warnings():  # restores the caller's warning display when the command ends
            warnings.showwarning = _one_line_warning
            try:
                code = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
            except _NO_ARGS as err:  # `jit2triton` alone: its help, as before click 8.2
                click.echo(err.ctx.get_help())
                sys.exit(0)
            except Exception as err:  # noqa: BLE001 - each kind gets its one line below
                if Group.debug:
                    raise
                sys.exit(_one_line(err))
            except KeyboardInterrupt:
                click.echo("error: interrupted", err=True)
                sys.exit(130)
        sys.exit(code if isinstance(code, int) else 0)


def _one_line(err: Exception) -> int:
    """Print `err` as one line on stderr; -> the exit code (2: the input was wrong, 1: a bug of ours)."""
    if isinstance(err, OutputsDiffer):
        message, code = err.format_message(), OUTPUTS_DIFFER
    elif isinstance(err, click.UsageError):
        where = f" (see `{err.ctx.command_path} --help`)" if err.ctx is not None else ""
        message, code = err.format_message() + where, 2
    elif isinstance(err, (click.ClickException, Jit2TritonError)):
        message, code = (err.format_message() if isinstance(err, click.ClickException) else str(err)), 2
    elif isinstance(err, click.Abort):  # click's form of Ctrl-C (KeyboardInterrupt): the shell's code for SIGINT
        message, code = "interrupted", 130
    else:
        message, code = (f"internal error, a bug in jit2triton: {type(err).__name__}: {err} (`jit2triton --debug "
                         "...` shows the traceback; please report it)"), 1
    message = " ".join(message.split())
    click.echo(f"error: {message if len(message) <= MESSAGE_LIMIT else message[:MESSAGE_LIMIT] + ' ...'}", err=True)
    return code


def _one_line_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """A warning as the CLI's errors are: one line on stderr in the user's words, without Python's source line."""
    text = " ".join(str(message).split())
    click.echo(f"warning: {text if len(text) <= MESSAGE_LIMIT else text[:MESSAGE_LIMIT] + ' ...'}", err=True)


def check_precision_options(precision, rtol, atol, io_precision) -> None:
    """convert's precision options in the command's words, before any work (the API names its arguments)."""
    reduced = precision in ("fp16", "bf16")
    if not reduced and (rtol is not None or atol is not None):
        raise click.UsageError("--rtol and --atol are the accuracy a reduced-precision package must meet: give them "
                               "with --precision fp16 or bf16")
    if io_precision not in (None, "model") and io_precision != precision:
        raise click.UsageError(f"--io-precision {io_precision} needs --precision {io_precision} (inputs and outputs "
                               "either keep the model's dtypes, 'model', or take the package's precision)")


def set_debug(ctx, param, value) -> None:
    Group.debug = value


def check_output(output: str, model: str = "", option: str = "-o") -> None:
    """Refuse, before any work, a path the command will write that cannot be written (a file is created and removed
    beside it, as the save will), that is not a regular file (/dev/null, a FIFO: the save would replace it), or
    that is the model itself."""
    from jit2triton.deploy.package import check_target

    if model and os.path.exists(model) and os.path.exists(output) and os.path.samefile(model, output):
        raise InputError(f"{option} {output} is {model} itself, which the command reads; give another path")
    try:
        check_target(output)
    except OSError as err:  # a WriteError, one line naming the path and the system's reason
        raise InputError(f"{option}: {err}") from None


def read_inputs_file(path: str) -> list:
    """The example inputs saved at `path`: a tuple or list of tensors (or a single tensor), in the model's order."""
    import torch

    how = "save the inputs in the model's order as a tuple: torch.save((x, mask), path)"
    loaded = _torch_file("--inputs-file", path, how)
    items = list(loaded) if isinstance(loaded, (tuple, list)) else [loaded]
    if isinstance(loaded, dict):
        names = ", ".join(repr(k) for k in list(loaded)[:4])
        raise InputError(f"--inputs-file {path} holds a dict (keys {names}), not inputs by position; {how}")
    wrong = [f"{i}: {type(x).__name__}" for i, x in enumerate(items)
             if not isinstance(x, (torch.Tensor, bool, int, float))]
    if wrong:
        raise InputError(f"--inputs-file {path}: item {wrong[0]} is not a tensor, int, float or bool; {how}")
    return items


def check_port(host: str, port: int) -> None:
    """An InputError where nothing can listen on host:port (in use, or not an address of this machine)."""
    import socket

    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the HTTP server binds: TIME_WAIT is fine
            probe.bind(address)
    except OSError as err:
        raise InputError(f"cannot listen on {host}:{port}: {err.strerror or err}; pick another --port (or stop "
                         "what holds it)") from None


def _torch_file(option: str, path: str, how: str):
    """What torch.save wrote at `path`, read without unpickling code; an InputError naming `option` otherwise."""
    import torch
    try:
        return torch.load(path, weights_only=True)  # weights_only: never unpickle code
    except Exception as err:  # noqa: BLE001 - not a torch file, or one that pickles code
        first = (str(err).strip().splitlines() or [type(err).__name__])[0][:200]
        raise InputError(f"{option} {path}: torch.load(weights_only=True) cannot read it ({first}); {how}") from None


def read_input_sets(path: str) -> list:
    """--verify-inputs: a list of input sets saved at `path`, each a tuple of the model's inputs in order."""
    how = "save a list of input tuples, in the model's order: torch.save([(x1, mask1), (x2, mask2)], path)"
    loaded = _torch_file("--verify-inputs", path, how)
    if not isinstance(loaded, (list, tuple)) or not all(isinstance(s, (list, tuple)) for s in loaded):
        raise InputError(f"--verify-inputs {path} holds a {type(loaded).__name__}, not a list of input tuples; {how}")
    return [tuple(s) for s in loaded]
