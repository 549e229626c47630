"""python -m deploy <command> ...: deployment's command line.

    python -m deploy import-hf SOURCE TARGET   a model in the Hugging Face layout → a checkpoint folder
    python -m deploy export-hf CHECKPOINT OUT  a checkpoint → a Hugging Face model folder (from_pretrained)
    python -m deploy export --checkpoint … --repository … --name … [--engine workbench|vllm]
                                               a checkpoint → a Triton model entry, served by either engine
    python -m deploy triton --repository …   a local Triton server with explicit model control
    python -m deploy onnx --checkpoint … --output model.onnx   the forward as ONNX, checked with onnxruntime
    python -m deploy export-trtllm SOURCE REPOSITORY --name …   a Triton entry for TensorRT-LLM's LLM-API backend

Each command is one entry of ``COMMANDS``: its name → (a function adding its arguments to its subparser, a function
running it on the parsed arguments and returning the exit status: 0 done, 2 refused with one line saying why). The
first line of the run function's docstring is the command's help.
"""
from __future__ import annotations

import argparse
import sys
from typing import Callable

from deploy import export, hf_export, hf_import, onnx_export, triton, trtllm_entry
from deploy.vllm import entry as vllm_entry

AddArguments = Callable[[argparse.ArgumentParser], None]
Run = Callable[[argparse.Namespace], int]
# export --engine: what writes each engine's entry
EXPORTERS: dict[str, export.Exporter] = {"workbench": export.export, "vllm": vllm_entry.export}


def run_export(args: argparse.Namespace) -> int:
    return export.run(args, EXPORTERS)


run_export.__doc__ = export.run.__doc__

COMMANDS: dict[str, tuple[AddArguments, Run]] = {
    "import-hf": (hf_import.add_arguments, hf_import.run),
    "export-hf": (hf_export.add_arguments, hf_export.run),
    "export": (export.add_arguments, run_export),
    "triton": (triton.add_arguments, triton.run),
    "onnx": (onnx_export.add_arguments, onnx_export.run),
    "export-trtllm": (trtllm_entry.add_arguments, trtllm_entry.run),
}


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="python -m deploy", description=__doc__.split("\n")[0])
    commands = top.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (add_arguments, run) in COMMANDS.items():
        summary = (run.__doc__ or "").strip().split("\n")[0]
        sub = commands.add_parser(name, help=summary, description=summary)
        add_arguments(sub)
        sub.set_defaults(run=run)
    return top


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
