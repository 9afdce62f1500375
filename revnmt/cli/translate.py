"""revnmt-translate (also ``python translate.py``): translate raw text with a trained checkpoint, one
output line per input line (or, with --nbest N, N lines ``i ||| translation ||| score``).

    revnmt-translate --checkpoint runs/m30k [-i test.en] [-o test.hyp] [--beam 5] [--nbest N] [--replace-unk]
                     [--length-penalty 1.0 [--length-penalty-type average|gnmt]]
                     [--reference test.de [--json scores.json]]
    revnmt-translate --checkpoint runs/a runs/b runs/c ...     # an ensemble
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import stat
import sys
from collections.abc import Sequence

from buffers import FixedPointOverflowError
from revnmt.arguments import check_device, default_device, non_negative_float
from revnmt.atomic import check_output, same_file, write_output_text
from revnmt.data import decode_lines, decode_stream, read_lines
from revnmt.training.interrupts import exit_on_signals
from revnmt.translation import LENGTH_PENALTY_TYPES, LengthPenalty, Translation, Translator, evaluate

PROG = "revnmt-translate"
logger = logging.getLogger("revnmt.translate")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n")[0])
    parser.add_argument("--checkpoint", required=True, nargs="+", metavar="PATH",
                        help="checkpoint file, or run directory (its best.pt); several make an ensemble, which "
                        "averages the models' log-probabilities at every step (they must share vocabularies and "
                        "tokenization; --replace-unk follows the first one's attention)")
    parser.add_argument("-i", "--input", metavar="FILE",
                        help="raw source text, one sentence per line (default: stdin; from a pipe or a terminal, "
                        "each batch is translated and written as soon as its lines are in)")
    parser.add_argument("-o", "--output", metavar="FILE",
                        help="where translations go (default: stdout): a file is replaced atomically, a device, a FIFO "
                        "or /dev/stdout written in place")
    parser.add_argument("--beam", type=int, default=5, help="beam size, 1 for greedy search (default: %(default)s)")
    parser.add_argument("--nbest", type=int, metavar="N",
                        help="write each input line's N best translations, best first, as lines 'i ||| translation "
                        "||| score' (i: the input line's number from 0; score: what beam search ranks by, the "
                        "log-probability / lp(length)); needs --beam N or more; --reference scores the first of each "
                        "line. A line has fewer only where the beam finished fewer (scores NaN or -inf: a diverged "
                        "model); one without words, or with no finished translation, has the empty one, score nan "
                        "(default: one translation per line)")
    parser.add_argument("--length-penalty", type=non_negative_float, default=1.0, metavar="ALPHA",
                        help="beam search ranks finished translations by log-probability / lp(length), length "
                        "counting the end of sentence; 0: unnormalized (favours short translations), larger values "
                        "favour longer ones; no effect on greedy search (default: %(default)s)")
    parser.add_argument("--length-penalty-type", choices=LENGTH_PENALTY_TYPES, default="average",
                        help="lp(length): average = length^ALPHA (with the default ALPHA 1, the mean log-probability "
                        "per token), gnmt = ((5 + length) / 6)^ALPHA (Wu et al. 2016; ALPHA 0.6 to 1 is usual) "
                        "(default: %(default)s)")
    parser.add_argument("--batch-size", type=int, default=32, help="sentences per batch (default: %(default)s)")
    parser.add_argument("--device", default=default_device(),
                        help="cpu, cuda or cuda:N (default: %(default)s)")
    parser.add_argument("--reference", metavar="FILE", help="raw reference translations: print BLEU to stderr")
    parser.add_argument("--json", metavar="FILE", help="with --reference, also write the scores to this file")
    parser.add_argument("--replace-unk", action="store_true",
                        help="replace each <unk> in the output by the source word attended most when it was produced "
                        "(word vocabularies; subword models have no <unk> to replace)")
    parser.add_argument("--max-len", type=int, metavar="N",
                        help="truncate inputs to this many tokens, pieces for a subword model (default: the training "
                        "--max-len, else 100)")
    args = parser.parse_args(argv)
    if args.json and not args.reference:
        parser.error("--json writes the scores against --reference: give --reference too")
    for name in ("beam", "batch_size", "max_len", "nbest"):
        value = getattr(args, name)
        if value is not None and value < 1:
            parser.error(f"--{name.replace('_', '-')} must be positive, got {value}")
    if args.nbest is not None and args.nbest > args.beam:
        parser.error(f"--nbest {args.nbest} needs --beam {args.nbest} or more, got --beam {args.beam}: beam search "
                     "keeps --beam translations of a line")
    check_device(parser, args.device)
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format=f"{PROG}: %(levelname)s: %(message)s", stream=sys.stderr)
    return exit_on_signals(PROG, lambda: _translate(args))


def _translate(args: argparse.Namespace) -> int:
    """Translate as ``args`` say; the exit status."""
    try:
        _check_distinct_files(args)
        # Python sets sys.stdin or sys.stdout to None when it starts with that descriptor closed (<&-, >&-).
        if args.input is None and sys.stdin is None:
            raise ValueError("stdin is closed: give -i FILE or pipe sentences in")
        if args.output is None and sys.stdout is None:
            raise ValueError("stdout is closed: give -o FILE or redirect the output")
        # Before any translating: a translation that cannot be written is lost at the end.
        for path in (args.output, args.json):
            if path is not None:
                check_output(path)
        # A file given with -i, or redirected to stdin, is read whole and translated in batches sorted by
        # length (faster); a pipe or a terminal streams.
        lines = read_lines(args.input) if args.input is not None else _whole_stdin()
        references = read_lines(args.reference) if args.reference else None
        # Before stdin is read: a bad checkpoint should not wait for the user's input to fail.
        translator = Translator.from_checkpoints(args.checkpoint, args.device, args.max_len)
        translator.check_replace_unk(args.replace_unk)
        if lines is not None:
            _check_reference_count(args.reference, references, len(lines))
        elif sys.stdin.isatty():
            logger.info("reading sentences from the terminal until end of input (Ctrl-D)")
    # Missing or unreadable files are the user's to fix: one line, no traceback.
    except (OSError, ValueError, RuntimeError) as error:
        return _fail(error)

    try:
        if lines is None:
            translations = _stream(args, translator)
        else:
            translations = translator.translate_nbest(lines, args.nbest, beam=args.beam, batch_size=args.batch_size,
                                                      progress=sys.stderr.isatty(), replace_unk=args.replace_unk,
                                                      length_penalty=_length_penalty(args))
            if args.output is None:
                _write_stdout(_output_text(args, translations))
    except BrokenPipeError:  # the reader went away (| head): stop quietly, as other Unix tools do
        return 1
    except _StdoutError as error:
        return _fail(error)
    except FixedPointOverflowError as error:  # a checkpoint whose weights diverged
        return _fail(ValueError(f"{' '.join(args.checkpoint)}: the model's weights overflow its fixed-point states "
                                f"({error}): the run that wrote it diverged"))
    hyps = [best.text for best, *_ in translations]  # what --reference scores: the best of each line
    try:
        if args.output is not None:
            _write_file(args.output, _output_text(args, translations))
        _check_reference_count(args.reference, references, len(hyps))
    except (OSError, ValueError) as error:
        return _fail(error)
    if references is not None and hyps:
        scores = evaluate(hyps, references, translator.data)
        for line in scores.lines():
            print(line, file=sys.stderr)
        if args.json:
            result = {"input": args.input, "reference": args.reference, "beam": args.beam,
                      "length_penalty": args.length_penalty, "length_penalty_type": args.length_penalty_type,
                      "replace_unk": args.replace_unk, **scores.to_dict()}
            try:
                _write_file(args.json, json.dumps(result, indent=2) + "\n")
            except OSError as error:
                return _fail(error)
    return 0


def _check_distinct_files(args: argparse.Namespace) -> None:
    """ValueError if an output (``-o``, ``--json``) would replace an input (``-i``, ``--reference``) or the
    other output: the same file by inode, so that links count (:func:`revnmt.atomic.same_file`)."""
    inputs = [("-i", args.input), ("--reference", args.reference)]
    outputs = [("-o", args.output), ("--json", args.json)]
    for number, (option, output) in enumerate(outputs):
        for other, path in inputs + outputs[number + 1:]:
            if output is not None and path is not None and same_file(output, path):
                raise ValueError(f"{option} {output} is the same file as {other} {path}: choose another {option}")


def _whole_stdin() -> list[str] | None:
    """stdin's lines when it is a regular file (``< FILE``); None for a pipe or a terminal, which stream."""
    if not stat.S_ISREG(os.fstat(sys.stdin.fileno()).st_mode):
        return None
    return decode_lines(sys.stdin.buffer.read(), "stdin")


def _stream(args: argparse.Namespace, translator: Translator) -> list[list[Translation]]:
    """Translate stdin as its lines arrive, each batch written (unless ``-o``) and flushed at once;
    returns every line's translations."""
    # The reader thread gets a stream of its own: Python aborts at exit if a daemon thread is still
    # reading sys.stdin.buffer.
    stdin = open(sys.stdin.fileno(), "rb", closefd=False)
    translations = []
    for line in translator.translate_stream_nbest(decode_stream(stdin, "stdin"), args.nbest, beam=args.beam,
                                                  batch_size=args.batch_size, replace_unk=args.replace_unk,
                                                  length_penalty=_length_penalty(args)):
        translations.append(line)
        if args.output is None:
            _write_stdout(_output_text(args, [line], first=len(translations) - 1))
    return translations


def _output_text(args: argparse.Namespace, translations: list[list[Translation]], first: int = 0) -> str:
    """The output of consecutive input lines, numbered from ``first``: one translation a line, or with
    ``--nbest`` each line's list, a translation a line as ``i ||| translation ||| score`` (scores to 6 decimals)."""
    if args.nbest is None:
        return "".join(f"{best.text}\n" for best, *_ in translations)
    return "".join(f"{number} ||| {text} ||| {score:.6f}\n"
                   for number, line in enumerate(translations, start=first) for text, score in line)


def _length_penalty(args: argparse.Namespace) -> LengthPenalty:
    """The length penalty of ``--length-penalty`` and ``--length-penalty-type``."""
    return LengthPenalty(args.length_penalty, args.length_penalty_type)


class _StdoutError(Exception):
    """stdout could not take the translations (a full disk, /dev/full): one line of error, not a traceback."""


def _write_stdout(text: str) -> None:
    """Write ``text`` to stdout and flush it. If that fails, a BrokenPipeError (the reader left, as after
    ``| head``) passes on as it is, another error as a :class:`_StdoutError`; either way stdout is pointed
    at /dev/null first, so that Python's own flush at exit does not fail again on what is left."""
    try:
        sys.stdout.buffer.write(text.encode("utf-8"))
        sys.stdout.buffer.flush()
    except OSError as error:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        if isinstance(error, BrokenPipeError):
            raise
        raise _StdoutError(f"cannot write to stdout: {error.strerror}") from error


def _write_file(path: str, text: str) -> None:
    """:func:`write_output_text`, with an error (a full disk) that names the file; the old file stays."""
    try:
        write_output_text(path, text)
    except OSError as error:
        raise type(error)(f"cannot write {path}: {error.strerror or error}") from error


def _check_reference_count(path: str | None, references: list[str] | None, inputs: int) -> None:
    """Scores need one reference line per input line."""
    if references is not None and len(references) != inputs:
        raise ValueError(f"{path} has {len(references)} lines but the input has {inputs}")


def _fail(error: Exception) -> int:
    """Report an error that is the user's to fix in one line, without a traceback; the exit status."""
    print(f"{PROG}: error: {error}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
