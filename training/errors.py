"""The one base class of the errors a user can act on: train.py and eval.py print its message as one line
and exit 1, where any other exception is a bug and keeps its traceback."""


class NormlabError(Exception):
    """A problem with the user's input (config, data, checkpoint, run directory) whose message names the fix."""


class CheckpointError(NormlabError, ValueError):
    """A checkpoint that cannot be used here; the message says why and what to do."""


class UnsafeCheckpointError(CheckpointError):
    """A checkpoint whose unpickling would need more than tensors and plain data."""


def first_clause(err: BaseException) -> str:
    """An exception's first line, short: torch's own texts run to paragraphs (the whole goes to the debug log)."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    return (lines[0].split(". ")[0] if lines else type(err).__name__)[:160]
