"""The known-defects ledger (CONTRACTS §7): which failures of a real backend are known.

A ledger is a plain TOML file shipped with the harness (``harness/judging/ledgers/``), one per
upstream package and version range, or any file a user names with ``--ledger FILE``. Its
entries each name a defect or difference of CONTRACTS §6, its upstream reference, the
cells it affects (a filter over the axes, as ``sweep --filter``) and its *signature*: the
failures the defect causes, each stated precisely (``fails``, a list of :class:`Symptom`):

- an exception: its exact type and a regular expression over TE's own message;
- a failed check: a glob over check names (``weight*.main_grad``) and the form of the
  failure - a regular expression over the check's message (``got ['bfloat16']``), or for a
  value check what the defect does to it: a defect model of ``harness.vocabulary.defects``
  (``model = "wgrad_in_activation_dtype"``: the value within its normal bound of the oracle
  with that defect applied, as the rank recorded it in ``Check.models``), or only where no
  model fits, a band of error/bound ratios; optionally for some cells only (``when``).

A symptom marked ``also`` is a consequence that fails *alongside* the defect (a wrong
``main_grad`` after a wrong finalize dtype), never its evidence on its own.

Applying a ledger to the verdicts is a pure fold (no torch; used by the sweep, ``merge``,
the pytest plugin and ``repro``):

- an entry *reproduces* in a cell that it selects when one of its (not ``also``) symptoms
  matches a failure of the cell;
- a cell that missed its expectation (``fail``, ``error``, ``timeout``) becomes ``known``
  when *every* failing item on every rank (each failed check, each exception) matches a
  symptom of an entry that reproduces in it; any other failure keeps it
  ``fail``/``error``/``timeout`` - a regression hiding in a known cell stays red. A harness
  error is never ``known``.
- an entry that selects cells of the run, reproduces in none of them and has at least one
  of them meet its expectation is *stale*: a fix landed, the gate fails until the entry is
  deleted. (An entry whose cells all fail earlier, for another entry's defect, is masked
  there: not exercised, never stale.)

Entries are checked when loaded, by rule (docs/ledgers.md): a message pattern carries at
least 12 literal characters of the text it matches (or is an exact form of an exact check
name); a value check states a model, or a band from 10x the bound spanning one decade;
``cells`` leaves out some cell of the full matrix; a must-raise check's form names the
exception raised and TE's text; Python's own error types pin their frame. A run record's
ledger is read back without the rules (it judged that run). A cell that stays failing under
a ledger has as its first failure what no entry explains, and the nearest entry's form.

The fold is idempotent: a ``known`` cell keeps its backend verdict in ``raw_status`` and is
judged again from it.
"""

from __future__ import annotations

import contextvars
import fnmatch
import json
import math
import re
import sys
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Iterable, Sequence

from harness.vocabulary.errors import LedgerError
from harness.vocabulary import defects, matrix
from harness.records.record import CellResult
from harness.records.fold import first_failure
from harness.vocabulary.status import PATH_NOT_TAKEN

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

__all__ = ["Entry", "Item", "Ledger", "LedgerError", "Symptom", "LEDGER_DIR", "FIXED", "FAILING", "NOT_EXERCISED",
           "Fold", "apply", "choose", "load", "failing_items", "stale_message", "unexplained"]

#: the ledgers shipped with the harness
LEDGER_DIR = Path(__file__).resolve().parent / "ledgers"
#: cell statuses a ledger may explain (a harness error never: it is no verdict on the backend)
EXPLAINABLE = ("fail", "error", "timeout")
KINDS = ("defect", "difference")
_UPSTREAM = re.compile(r"^(unreported|(TE|Megatron-LM|PyTorch) (PR|issue) #\d+( \(\w+\))?)$")
#: the least literal text a message pattern carries, in every alternative: enough of TE's own
#: words (or the harness's) that nothing generic matches it
MIN_LITERAL = 12
#: a ratio band starts this far above the bound (a value "just out of tolerance" is no
#: signature) and spans at most one decade
MIN_BAND_LOW = 10.0
MAX_BAND = 10.0
#: Python's own error types: their text is Python's, not TE's, so an exception symptom of one
#: pins the raising frame (``at``)
PROGRAMMING_ERRORS = ("AttributeError", "TypeError", "NameError", "UnboundLocalError", "KeyError",
                      "IndexError", "ImportError", "ModuleNotFoundError")
#: the checks of a cell that must raise (CONTRACTS §2): their failures are about an exception
MUST_RAISE_CHECKS = ("exception_names_both", "expected_exception")
#: ``expected_exception``'s form when nothing was raised at all
STEP_RAN = "but the step ran"
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*")
#: whether the validator's rules apply (a ledger file: yes; a run record's ledger: no)
_RULES: contextvars.ContextVar[bool] = contextvars.ContextVar("ledger_rules", default=True)
_AT = re.compile(r"[\w./-]+\.py:(\w+|<\w+>)")
_RAISED = re.compile(r"raised [A-Za-z_][\w.]*: ")


@dataclass(frozen=True)
class Item:
    """One failure of a cell, as the ledger judges it: a failed check or a rank's exception."""

    rank: int
    name: str  #: the check's name, or ``exception``
    kind: str  #: the check's kind (``tensor``, ``count``, ``flag``, ``dtype`` ...) or ``exception``
    text: str  #: the check's message, or the exception's message
    ratio: float | None = None  #: a value check's error/bound ratio
    type: str | None = None  #: the exception's type
    where: str | None = None  #: ``path:function`` of the frame that raised the exception
    #: a value check's error/bound ratio under each defect model that applies (``harness.vocabulary.defects``)
    models: dict[str, float] | None = None

    def describe(self) -> str:
        if self.name == "exception":
            return f"rank {self.rank}: {self.type}: {self.text}"
        ratio = f" (error/bound {self.ratio:.3g}" if self.ratio is not None else ""
        if self.models:
            under = ", ".join(f"{m} {r:.3g}" for m, r in sorted(self.models.items()))
            ratio = f"{ratio}; under {under}" if ratio else f" (under {under}"
        ratio += ")" if ratio else ""
        return f"rank {self.rank}: {self.name}: {self.text.splitlines()[0] if self.text else ''}{ratio}"


def _skeletons(pattern: str, cap: int = 256) -> list[str]:
    """Each alternative of a regular expression as the text every match of it contains: its
    literal characters, and ``\\0`` for a part that varies (a class, ``.``, a repeat beyond its
    minimum). Alternations multiply (at most ``cap``)."""
    try:  # Python >= 3.11
        import re._constants as c
        import re._parser as sre
    except ImportError:  # pragma: no cover - Python 3.10
        import sre_constants as c  # type: ignore[no-redef]
        import sre_parse as sre  # type: ignore[no-redef]

    def seq(items: Any) -> list[str]:
        out = [""]
        for op, av in items:
            if op is c.LITERAL:
                parts = [chr(av)]
            elif op is c.SUBPATTERN:
                parts = seq(av[-1])
            elif op is c.BRANCH:
                parts = [x for alt in av[1] for x in seq(alt)]
            elif op in (c.MAX_REPEAT, c.MIN_REPEAT) or op.name == "POSSESSIVE_REPEAT":
                low, high, sub = av
                parts = [x * min(low, 8) + ("\0" if high != low else "") for x in seq(sub)]
            elif op is c.AT:
                parts = [""]
            else:
                parts = ["\0"]
            out = [a + b for a in out for b in parts][:cap]
        return out

    return seq(sre.parse(pattern))


def _literal(skeleton: str) -> int:
    return len(skeleton.replace("\0", ""))


def _exact(pattern: str) -> bool:
    """A pattern that is one literal text anchored at the end of the message (``got 0$``)."""
    return pattern.endswith("$") and not pattern.endswith("\\$") and _skeletons(pattern) == [
        re.sub(r"\\(.)", r"\1", pattern.lstrip("^")[:-1])] and "\0" not in _skeletons(pattern)[0]


def _toml(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(f"{x:g}" for x in v) + "]"
    return json.dumps(v) if isinstance(v, str) else str(v)


@dataclass(frozen=True)
class Symptom:
    """One failure a defect causes, stated precisely enough that nothing else matches it.

    Attributes:
        check: glob over failed check names (``weight*.main_grad``); or
        exception: the exact exception type a rank raises (``RuntimeError``).
        message: regular expression searched in the check's message or the exception's
            message (TE's own text); required for exceptions and for checks without a
            ratio or model.
        ratio: ``(low, high)``: a value check fails by an error/bound ratio in this band -
            only where no defect model fits.
        model: a defect model of ``harness.vocabulary.defects``: the value check is within its normal
            bound of the oracle with that defect applied (its ratio under the model <= 1).
        at: ``file:function`` (a suffix of the path) of the frame that raised: pins an
            exception whose text is Python's (``'NoneType' object has no attribute``).
        when: a filter over the axes (``sweep --filter``): the cells this form is for,
            e.g. ``dtype == "fp16"`` for the fp16 band.
        also: a consequence failing alongside the defect, not evidence of it on its own.
    """

    check: str | None = None
    exception: str | None = None
    message: str | None = None
    ratio: tuple[float, float] | None = None
    model: str | None = None
    at: str | None = None
    when: str | None = None
    also: bool = False

    def validate(self, where: str) -> None:
        """Raises LedgerError when the symptom is malformed or broader than a signature (the
        rules of docs/ledgers.md, each refused with its one-line reason)."""
        if (self.check is None) == (self.exception is None):
            raise LedgerError(f"{where}: a symptom names exactly one of check or exception")
        if self.message is not None:
            self._validate_message(where)
        if self.when is not None:
            try:
                object.__setattr__(self, "_when", matrix.compile_filter(self.when))
            except matrix.MatrixError as exc:
                raise LedgerError(f"{where}: when: {exc}") from None
        if self.exception is not None:
            self._validate_exception(where)
            return
        if self.at is not None and self.check not in MUST_RAISE_CHECKS:
            raise LedgerError(f"{where}: at is for exceptions (and the checks of a cell that must raise) only")
        if self.at is not None and not _AT.fullmatch(self.at):
            raise LedgerError(f"{where}: at={self.at!r} must be file.py:function (e.g. module/linear.py:backward)")
        if not re.match(r"[A-Za-z]", self.check) or not re.search(r"[A-Za-z_]{3}", self.check):
            raise LedgerError(f"{where}: check pattern {self.check!r} is broader than a check name "
                              "(it must start with a name, as weight*.main_grad)")
        if self.check == "exception":
            raise LedgerError(f"{where}: check 'exception' would explain any exception; state its type and message")
        forms = [k for k in ("message", "ratio", "model") if getattr(self, k) is not None]
        if len(forms) != 1:
            raise LedgerError(f"{where}: check {self.check} needs exactly one form of its failure: a message "
                              "pattern, a defect model or (where no model fits) a ratio band"
                              + (f", not {' and '.join(forms)}" if forms else ""))
        if self.model is not None:
            if self.model not in defects.MODELS:
                raise LedgerError(f"{where}: model={self.model!r} is no defect model "
                                  f"(models: {', '.join(defects.MODELS)})")
            if not defects.applies(self.model, self.check):
                raise LedgerError(f"{where}: model {self.model} predicts {', '.join(defects.MODELS[self.model].checks)}, "
                                  f"not {self.check}")
        if self.ratio is not None and _RULES.get():
            lo, hi = self.ratio
            if not MIN_BAND_LOW <= lo < hi or hi / lo > MAX_BAND:
                raise LedgerError(f"{where}: ratio band {list(self.ratio)} must start at least {MIN_BAND_LOW:g}x "
                                  f"above the bound and span at most one decade ([low, high], {MIN_BAND_LOW:g} <= "
                                  f"low < high <= {MAX_BAND:g} x low); state a model where one fits")
        if self.check in MUST_RAISE_CHECKS and _RULES.get():
            self._validate_must_raise(where)

    def _validate_message(self, where: str) -> None:
        try:
            re.compile(self.message)
        except re.error as exc:
            raise LedgerError(f"{where}: message pattern {self.message!r}: {exc}") from None
        exact = (self.check is not None and not any(ch in self.check for ch in "*?[")
                 and _exact(self.message))
        short = min(_literal(k) for k in _skeletons(self.message))
        if short < MIN_LITERAL and not exact and self.at is None and _RULES.get():
            raise LedgerError(f"{where}: message pattern {self.message!r} carries {short} literal character(s) "
                              f"of the text it matches (at least {MIN_LITERAL} in every alternative, an exact "
                              "check name with an exact form such as 'got 0$', or the raising frame pinned "
                              "with at)")

    def _validate_exception(self, where: str) -> None:
        if not _IDENT.fullmatch(self.exception):
            raise LedgerError(f"{where}: exception={self.exception!r} must be an exception type name")
        if self.message is None:
            raise LedgerError(f"{where}: exception {self.exception} needs a message pattern (TE's text)")
        if self.ratio is not None or self.model is not None:
            raise LedgerError(f"{where}: an exception has no ratio or model")
        if self.at is not None and not _AT.fullmatch(self.at):
            raise LedgerError(f"{where}: at={self.at!r} must be file.py:function (e.g. module/linear.py:backward)")
        if self.exception in PROGRAMMING_ERRORS and self.at is None and _RULES.get():
            raise LedgerError(f"{where}: a {self.exception}'s text is Python's, not TE's: pin the frame that "
                              "raises it with at = \"file.py:function\"")

    def _validate_must_raise(self, where: str) -> None:
        """A must-raise check fails about an exception: its form states the type and TE's text
        (``raised RuntimeError: <text>``; a shorter text, ``raised KeyError: None``, only with the
        raising frame pinned by ``at``), or that nothing was raised (``but the step ran``)."""
        for k in _skeletons(self.message or ""):
            m = _RAISED.search(k)
            if k.endswith(STEP_RAN):
                continue
            if not m or (_literal(k[m.end():]) < MIN_LITERAL and self.at is None):
                raise LedgerError(f"{where}: a symptom of {self.check} states the exception raised, its type and "
                                  f"text ('raised RuntimeError: <at least {MIN_LITERAL} characters of TE's text>'), "
                                  f"or '{STEP_RAN}$': {self.message!r} does not")
            raised = m.group(0)[len("raised "):-2]
            if raised in PROGRAMMING_ERRORS and self.at is None:
                raise LedgerError(f"{where}: a {raised}'s text is Python's, not TE's: pin the frame that raises it "
                                  "with at = \"file.py:function\"")

    def matches(self, item: Item, cell: matrix.Cell) -> bool:
        if self.when is not None and not self._when(cell):  # type: ignore[attr-defined]
            return False
        if self.exception is not None:
            return (item.kind == "exception" and item.type == self.exception
                    and re.search(self.message or "", item.text) is not None
                    and (self.at is None or _raised_at(item.where, self.at)))
        if item.name == "exception" or not fnmatch.fnmatchcase(item.name, self.check or ""):
            return False
        if self.at is not None and not _raised_at(item.where, self.at):
            return False
        if self.model is not None:  # the value within its bound of the oracle with the defect applied
            return (item.models or {}).get(self.model, math.inf) <= 1.0
        if item.ratio is not None or self.ratio is not None:  # a value check: its band says how wrong
            if item.ratio is None or self.ratio is None or not self.ratio[0] <= item.ratio <= self.ratio[1]:
                return False
        return self.message is None or re.search(self.message, item.text) is not None

    def form(self) -> str:
        """The symptom as the ledger states it, in one line (TOML's inline table)."""
        return "{ " + ", ".join(f"{k} = {_toml(v)}" for k, v in self.serialize().items()) + " }"

    def serialize(self) -> dict[str, Any]:
        d = {k: v for k, v in asdict(self).items() if v is not None and v is not False}
        if self.ratio is not None:
            d["ratio"] = list(self.ratio)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any], where: str) -> "Symptom":
        if not isinstance(d, dict):
            raise LedgerError(f"{where}: each of fails is a table such as "
                              "{ check = \"finalize_dtypes\", message = \"got \\\\['bfloat16'\" }")
        unknown = sorted(set(d) - set(cls.__dataclass_fields__))
        if unknown:
            raise LedgerError(f"{where}: a symptom has unknown key(s) {unknown}")
        ratio = d.get("ratio")
        if ratio is not None:
            if not (isinstance(ratio, list) and len(ratio) == 2 and all(isinstance(x, (int, float)) for x in ratio)):
                raise LedgerError(f"{where}: ratio must be [low, high], got {ratio!r}")
            ratio = (float(ratio[0]), float(ratio[1]))
        return cls(**{**d, "ratio": ratio})


@dataclass(frozen=True)
class Entry:
    """One known defect or difference.

    Attributes:
        id: short, stable name (``seed-grouped-fused``); what reports, xfail reasons and
            ``ledger report`` use.
        title: one line a maintainer reads.
        upstream: ``TE PR #3545`` / ``TE issue #N`` (optionally `` (open)``), or ``unreported``.
        row: the CONTRACTS §6 row it is (its first words suffice).
        kind: ``defect`` (loses or corrupts a gradient, or fails, under a supported use) or
            ``difference`` (a choice upstream may keep).
        cells: filter over the axes selecting the cells it affects (``sweep --filter``).
        fails: its signature: the failures it causes (:class:`Symptom`).
        where: the upstream source that causes it (file and function).
        contract: the CONTRACTS sentence it breaks (quoted in the upstream report).
        component: the package whose code has the defect, when it is not the ledger's own
            (``megatron-core 0.19.2`` in TE's ledger: the cells that show it run TE too, and a
            ledger is chosen by the backend's package); empty: the ledger's package.
    """

    id: str
    title: str
    upstream: str
    row: str
    kind: str
    cells: str
    fails: tuple[Symptom, ...] = ()
    where: str = ""
    contract: str = ""
    component: str = ""

    def __post_init__(self) -> None:
        where = f"ledger entry {self.id!r}"
        if not re.fullmatch(r"[a-z0-9][a-z0-9-]*", self.id):
            raise LedgerError(f"{where}: id must be lowercase letters, digits and '-'")
        if self.kind not in KINDS:
            raise LedgerError(f"{where}: kind={self.kind!r} (choose from {', '.join(KINDS)})")
        if not _UPSTREAM.match(self.upstream):
            raise LedgerError(f"{where}: upstream={self.upstream!r} (write 'TE PR #N', 'TE issue #N' or 'unreported')")
        if not any(not s.also for s in self.fails):
            raise LedgerError(f"{where}: fails states no symptom that is evidence of the defect (all 'also' or none)")
        for s in self.fails:
            s.validate(where)
        try:
            object.__setattr__(self, "_select", matrix.compile_filter(self.cells))
        except matrix.MatrixError as exc:
            raise LedgerError(f"{where}: cells: {exc}") from None
        if _RULES.get() and not matrix.restricts(self.cells):
            raise LedgerError(f"{where}: cells = {self.cells!r} selects every cell of the full matrix: "
                              "name the cells the defect affects")

    def selects(self, axes: dict[str, Any] | matrix.Cell) -> bool:
        """Whether the entry's ``cells`` filter selects the cell (its axis values, or the cell:
        what a caller testing every entry builds once)."""
        cell = axes if isinstance(axes, matrix.Cell) else matrix.Cell.from_dict(axes)
        return self._select(cell)  # type: ignore[attr-defined]

    def symptom(self, item: Item, cell: matrix.Cell) -> Symptom | None:
        """The first of this entry's symptoms ``item`` (a failure of ``cell``) matches, if any."""
        return next((s for s in self.fails if s.matches(item, cell)), None)

    def serialize(self) -> dict[str, Any]:
        d = asdict(self)
        d["fails"] = [s.serialize() for s in self.fails]
        if not d["component"]:  # the ledger's own package: said by the ledger
            del d["component"]
        return d

    @classmethod
    def from_record(cls, d: dict[str, Any]) -> "Entry":
        """From a run record's ledger entry, whose per-run outcome keys are dropped. The
        validator's rules are not applied again: the entry judged that run (an older record's
        ledger may predate a rule, e.g. its wider ratio bands), so it must stay readable."""
        token = _RULES.set(False)
        try:
            return cls.from_dict({k: v for k, v in d.items() if k in cls.__dataclass_fields__})
        finally:
            _RULES.reset(token)

    @classmethod
    def from_dict(cls, d: dict[str, Any], where: str = "ledger") -> "Entry":
        name = d.get("id", "?")
        if "checks" in d or "error" in d:
            raise LedgerError(f"{where}: entry {name!r} uses checks/error, which explain any failure of "
                              "those names: state its signature as fails = [...] (docs/ledgers.md)")
        unknown = sorted(set(d) - set(cls.__dataclass_fields__))
        if unknown:
            raise LedgerError(f"{where}: entry {name!r} has unknown key(s) {unknown}")
        missing = [k for k in ("id", "title", "upstream", "row", "kind", "cells", "fails") if k not in d]
        if missing:
            raise LedgerError(f"{where}: entry {name!r} lacks {', '.join(missing)}")
        fails = tuple(Symptom.from_dict(s, f"{where}: entry {name!r}") for s in d["fails"])
        return cls(**{**d, "fails": fails})


@dataclass(frozen=True)
class Ledger:
    """A ledger file: which upstream versions it is for, and its entries."""

    name: str
    path: str
    package: str | None
    versions: str | None
    entries: tuple[Entry, ...] = ()

    def serialize(self) -> dict[str, Any]:
        return {"name": self.name, "path": self.path, "package": self.package, "versions": self.versions,
                "entries": [e.serialize() for e in self.entries]}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Ledger":
        """From ``serialize()`` or a run record's ``ledger`` (whose per-entry outcome is dropped)."""
        entries = tuple(Entry.from_record(e) for e in d.get("entries", []))
        return cls(d["name"], d["path"], d.get("package"), d.get("versions"), entries)

    def entry(self, entry_id: str) -> Entry:
        for e in self.entries:
            if e.id == entry_id:
                return e
        raise LedgerError(f"no entry {entry_id!r} in ledger {self.name} "
                          f"(entries: {', '.join(e.id for e in self.entries) or 'none'})")

    def covers(self, package: str | None, version: str | None) -> bool:
        """Whether this ledger is for ``package`` at ``version``."""
        from packaging.specifiers import SpecifierSet
        from packaging.version import InvalidVersion, Version

        if not package or not version or package != self.package:
            return False
        try:
            return Version(version) in SpecifierSet(self.versions or "")
        except InvalidVersion:
            return False


def load(path: str | Path) -> Ledger:
    """Read and check a ledger file.

    Raises:
        LedgerError: unreadable, not TOML, without entries, or an entry that is malformed (one
            line saying which).
    """
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text())
    except OSError as exc:
        raise LedgerError(f"cannot read ledger {str(path)!r}: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise LedgerError(f"ledger {str(path)!r} is not valid TOML: {exc}") from None
    head = data.get("ledger", {})
    unknown = sorted(set(data) - {"ledger", "entry"}) + sorted(set(head) - {"package", "versions", "title"})
    if unknown:
        raise LedgerError(f"ledger {str(path)!r}: unknown key(s) {unknown}")
    if head.get("versions"):
        from packaging.specifiers import InvalidSpecifier, SpecifierSet
        try:
            SpecifierSet(head["versions"])
        except InvalidSpecifier:
            raise LedgerError(f"ledger {str(path)!r}: versions={head['versions']!r} is no version range "
                              "(e.g. '>=2.20.2,<2.21')") from None
    entries = tuple(Entry.from_dict(e, str(path)) for e in data.get("entry", []))
    if not entries:
        # an empty file (a truncated write, the wrong path) would judge a run as if no defect
        # were known and be reported as the ledger it used: say so instead
        what = "is empty" if not data else "has no entries"
        raise LedgerError(f"ledger {str(path)!r} {what}: a ledger states known defects as [[entry]] tables "
                          "(docs/ledgers.md); to judge without one, pass --ledger none")
    dup = sorted({e.id for e in entries if sum(o.id == e.id for o in entries) > 1})
    if dup:
        raise LedgerError(f"ledger {str(path)!r}: duplicate entry id(s) {dup}")
    return Ledger(path.stem, str(path), head.get("package"), head.get("versions"), entries)


def shipped() -> list[Ledger]:
    return [load(p) for p in sorted(LEDGER_DIR.glob("*.toml"))]


def choose(option: str | None, package: str | None, version: str | None) -> Ledger | None:
    """The ledger a run uses: ``none``; a file; or (``auto``, the default) the shipped ledger
    for the backend's upstream package and version, if there is one.

    Raises:
        LedgerError: the file is unusable, or two shipped ledgers claim the same version.
    """
    if option == "none":
        return None
    if option not in (None, "auto"):
        return load(option)
    found = [l for l in shipped() if l.covers(package, version)]
    if len(found) > 1:
        raise LedgerError(f"ledgers {', '.join(l.path for l in found)} all cover {package} {version}")
    return found[0] if found else None


def failing_items(cell: CellResult) -> list[Item]:
    """Every failing item of a cell: each failed check, and a rank's exception where no failed
    check of kind ``exception`` carries it. In a cell that must raise (CONTRACTS §2) raising
    is what the contract asks: ``exception_names_both`` judges the exception and, when it
    fails, quotes it - its message pattern is the exception's form."""
    items = []
    for r in cell.ranks:
        if r.status in ("pass", "xfail"):
            continue
        failed = [c for c in r.comparisons if not c.ok]
        # a must-raise check quotes the rank's exception: its frame pins it as an exception's would
        raised = _innermost((r.error or {}).get("traceback") or "") if cell.expect == "error" else None
        mine = [_exception(r.rank, r.error, c.message) if c.name == "exception" else
                Item(r.rank, c.name, c.kind, c.message or "", c.ratio, models=c.models,
                     where=raised if c.kind == "exception" else None) for c in failed]
        carried = any(c.kind == "exception" for c in failed) or cell.expect == "error"
        if r.error and not carried:
            mine.append(_exception(r.rank, r.error, None))
        if not mine:  # a rank that missed its expectation with nothing to show for it
            mine.append(Item(r.rank, "exception", "exception", f"{r.status}: no check and no exception recorded"))
        items.extend(mine)
    if not items:
        items.append(Item(-1, "exception", "exception", f"{cell.status}: {cell.first_failure or 'no rank result'}"))
    return items


def _exception(rank: int, error: dict[str, str] | None, message: str | None) -> Item:
    """A rank's exception as an item: from its error record, else from the ``Type: message``
    of the check that carries it."""
    if error:
        return Item(rank, "exception", "exception", str(error.get("message")), type=error.get("type"),
                    where=_innermost(error.get("traceback") or ""))
    typ, _, text = (message or "").partition(": ")
    return Item(rank, "exception", "exception", text, type=typ)


_FRAME = re.compile(r'^\s*File "([^"]+)", line \d+, in (\S+)', re.M)


def _innermost(traceback: str) -> str | None:
    """``path:function`` of the last frame of a formatted traceback."""
    frames = _FRAME.findall(traceback)
    return f"{frames[-1][0]}:{frames[-1][1]}" if frames else None


def _raised_at(where: str | None, at: str) -> bool:
    if where is None:
        return False
    path, _, function = where.rpartition(":")
    want_path, _, want_function = at.rpartition(":")
    return function == want_function and path.replace("\\", "/").endswith("/" + want_path)


def unexplained(cell: CellResult, entries: Sequence[Entry]) -> list[Item]:
    """The failures of ``cell`` that no entry reproducing in it explains (all of them when no
    entry reproduces): in a cell the ledger knows, these are the regressions."""
    axes = matrix.Cell.from_dict(cell.axes) if entries else None
    return _explain(cell, [e for e in entries if e.selects(axes)], axes)[1]


def _explain(cell: CellResult, selecting: Sequence[Entry],
             axes: matrix.Cell | None = None) -> tuple[set[str], list[Item]]:
    """The entries reproducing in ``cell`` and its failing items none of them explains
    (``axes``: the cell's, where the caller has built them)."""
    axes = axes or matrix.Cell.from_dict(cell.axes)
    items = failing_items(cell)
    matched = [{e.id: s for e in selecting if (s := e.symptom(item, axes)) is not None} for item in items]
    reproduced = {i for m in matched for i, s in m.items() if not s.also}
    left = [item for item, m in zip(items, matched) if not reproduced.intersection(m)]
    return reproduced, left


#: how the first failure of a cell that stays failing under a ledger begins (``_unexplained_line``)
_LEDGER_LINES = ("unexplained by the ledger: ", "no ledger entry reproduces here: ")


def _unexplained_line(cell: CellResult, selecting: Sequence[Entry], left: list[Item], reproduced: set[str]) -> str:
    """A failing cell's line under a ledger: the first failure no entry explains and the
    nearest entry's form for it (the regression a reviewer must look at)."""
    axes = matrix.Cell.from_dict(cell.axes)
    if not left:  # every failure is a consequence ('also') of entries whose evidence is missing
        item = failing_items(cell)[0]
        return (f"no ledger entry reproduces here: {item.describe()} is only a consequence ('also') in "
                f"{', '.join(e.id for e in selecting)}, whose evidence is missing")
    item = left[0]
    near = [(e, s) for e in selecting for s in e.fails
            if (s.exception is not None and s.exception == item.type)
            or (s.check is not None and item.name != "exception" and fnmatch.fnmatchcase(item.name, s.check))]
    applicable = [(e, s) for e, s in near if s.when is None or s._when(axes)]  # type: ignore[attr-defined]
    if applicable or near:
        e, s = (applicable or near)[0]
        why = " (its evidence does not reproduce here)" if e.id not in reproduced and not s.also else ""
        nearest = f"nearest: {e.id} {s.form()}{why}"
    else:
        nearest = f"no form for it in {', '.join(e.id for e in selecting)}"
    more = f" (+{len(left) - 1} more)" if len(left) > 1 else ""
    return f"unexplained by the ledger: {item.describe()}{more}; {nearest}"


@dataclass
class _Tally:
    selected: list[str] = field(default_factory=list)
    reproduced: list[str] = field(default_factory=list)
    known: list[str] = field(default_factory=list)
    met: list[str] = field(default_factory=list)  #: selected cells that met their expectation
    #: selected cells where TE ran another path than the cell names (never "met", never known)
    other_path: list[str] = field(default_factory=list)


def judge(cell: CellResult, entries: Sequence[Entry]) -> tuple[CellResult, list[Entry], set[str]]:
    """The cell under the ledger, the entries selecting it, and those reproducing in it."""
    base = cell.raw_status if cell.status == "known" and cell.raw_status else cell.status
    # the backend's own first failure, where a ledger's line (below) had replaced it
    ledgered = (cell.first_failure or "").startswith(_LEDGER_LINES) and cell.ranks
    raw = replace(cell, status=base, raw_status=None, known=None,
                  first_failure=first_failure(cell.ranks) if ledgered else cell.first_failure)
    axes = matrix.Cell.from_dict(cell.axes) if entries else None
    selecting = [e for e in entries if e.selects(axes)]
    if base not in EXPLAINABLE or not selecting:
        return raw, selecting, set()
    reproduced, left = _explain(raw, selecting, axes)
    if left or not reproduced:
        # a cell that ran (not one whose launch hung: its line says which rank and why)
        ran = raw.ranks and not any((r.error or {}).get("type") in ("Timeout", "NoReport") for r in raw.ranks)
        if ran and base in ("fail", "error"):
            raw = replace(raw, first_failure=_unexplained_line(raw, selecting, left, reproduced))
        return raw, selecting, reproduced
    ids = [e.id for e in selecting if e.id in reproduced]
    return replace(raw, status="known", raw_status=base, known=ids), selecting, reproduced


#: what a run says of an entry: its defect is still failing (it reproduces), fixed here (it
#: reproduces in none of its cells and at least one of them now meets its expectation), or not
#: exercised (no cell of the run selects it, or every one it selects fails earlier, for
#: another entry's defect: masked, or ran another TE path than it names - ``path_not_taken``:
#: so nothing can be said)
FIXED, FAILING, NOT_EXERCISED = "fixed here", "still failing", "not exercised"


class Fold:
    """``apply`` one cell at a time: each verdict judged as it arrives (``add``), the entries'
    tallies kept, the outcome read at the end (``outcome``) - so a sweep judges a stream of
    verdicts without holding them (docs/performance.md, "the parent's memory")."""

    def __init__(self, ledger: Ledger | None, judge_stale: bool = True, required: Sequence[str] | None = None) -> None:
        self.ledger, self.judge_stale, self.required = ledger, judge_stale, required
        self._tally = {e.id: _Tally() for e in ledger.entries} if ledger else {}

    def add(self, cell: CellResult) -> CellResult:
        """``cell`` judged under the ledger (a skipped cell as it is), counted into its entries."""
        if self.ledger is None:
            return judge(cell, ())[0]
        if cell.status == "skipped":
            return cell
        judged, selecting, reproduced = judge(cell, self.ledger.entries)
        for e in selecting:
            t = self._tally[e.id]
            t.selected.append(cell.id)
            if judged.status in ("pass", "xfail"):
                t.met.append(cell.id)
            elif judged.status == PATH_NOT_TAKEN:
                t.other_path.append(cell.id)
            if e.id in reproduced:
                t.reproduced.append(cell.id)
            if judged.known and e.id in judged.known:
                t.known.append(cell.id)
        return judged

    def outcome(self) -> dict[str, Any] | None:
        """The ledger's outcome over the cells added so far (``apply``'s), None without a ledger."""
        if self.ledger is None:
            return None
        judge_stale, required = self.judge_stale, self.required
        outcome = self.ledger.serialize()
        stale, unfixed = [], []
        for e in outcome["entries"]:
            t = self._tally[e["id"]]
            # fixed only where it could have shown: a selected cell that now meets its expectation;
            # cells that all fail earlier (another entry's defect) leave it not exercised, not stale
            verdict = FAILING if t.reproduced else FIXED if t.met else NOT_EXERCISED
            e.update(selected=list(t.selected), reproduced=list(t.reproduced), known_cells=list(t.known),
                     verdict=verdict, path_not_taken=list(t.other_path),
                     stale=judge_stale and required is None and verdict == FIXED)
            if required is not None:
                e["required"] = e["id"] in required
                if e["required"] and (verdict != FIXED if judge_stale else verdict == FAILING):
                    unfixed.append(e["id"])
            if e["stale"]:
                stale.append(e["id"])
        outcome["stale"] = stale
        outcome["judged_stale"] = judge_stale
        if required is not None:
            outcome["required"] = list(required)
            outcome["unfixed"] = unfixed
        return outcome


def apply(cells: Iterable[CellResult], ledger: Ledger | None, judge_stale: bool = True,
          required: Sequence[str] | None = None) -> tuple[list[CellResult], dict[str, Any] | None]:
    """The cells under ``ledger`` and the ledger's outcome for the run record (``Fold`` over
    a list).

    The outcome is the ledger (``Ledger.serialize()``) with, per entry, the cells it
    selects, reproduces in and explains (``known``), its ``verdict`` (``FIXED``, ``FAILING``,
    ``NOT_EXERCISED``), ``path_not_taken`` (the selected cells where TE ran another path: they
    never count as met) and ``stale`` (selects cells, reproduces in none); ``stale`` lists the
    stale entries' ids. With ``judge_stale=False`` (a shard of a sweep: the entry may
    reproduce in another shard) no entry is stale.

    ``required`` (a change under review, ``sweep --fixes``): the entries the change must fix.
    Then an entry fixed here is the news the review wants, never stale; ``unfixed`` lists the
    required entries that are not fixed here (each fails the gate).
    """
    fold = Fold(ledger, judge_stale, required)
    return [fold.add(c) for c in cells], fold.outcome()


def stale_message(entry_id: str, outcome: dict[str, Any]) -> str:
    """The gate's line for a stale entry (every output says it in these words)."""
    e = next(x for x in outcome["entries"] if x["id"] == entry_id)
    where = outcome.get("path") or "the ledger"
    return (f"ledger entry {entry_id} ({e['upstream']}) no longer reproduces in any of the "
            f"{len(e.get('selected') or [])} cell(s) it selects: delete it from {where}")
