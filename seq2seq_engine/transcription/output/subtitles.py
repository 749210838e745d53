"""Subtitle cues of a transcript for srt / vtt: word units broken into short cues of a few short lines."""
from __future__ import annotations

import dataclasses
import math
import re
import unicodedata
from typing import Any, List, Optional, Sequence, Tuple

from seq2seq_engine.errors import ParameterError
from seq2seq_engine.transcription.output.cue_timing import Cue, shown_times

# A cue never lasts longer, and never runs across a silence longer than PAUSE_SECONDS between two word units.
MAX_CUE_SECONDS = 7.0
PAUSE_SECONDS = 1.0
DEFAULT_LINE_WIDTH = 42   # characters: the usual limit of broadcast subtitles (and openai-whisper's --max_line_width)
DEFAULT_LINE_COUNT = 2
# A line or a cue preferably ends after one of these.
BREAK_AFTER = frozenset(".,?!;:。、？！，；：")
# Scripts written without spaces between words (with their punctuation and full-width forms): each character is a
# word unit, and no space joins two of them.
_CJK_RANGES = ((0x3000, 0x303F), (0x3040, 0x30FF), (0x31F0, 0x31FF), (0x3400, 0x4DBF), (0x4E00, 0x9FFF),
               (0xF900, 0xFAFF), (0xFF00, 0xFF9F), (0x20000, 0x2FA1F))
_RUNS = re.compile(r"\S+")


@dataclasses.dataclass(frozen=True)
class SubtitleOptions:
    """How srt / vtt cues are cut (openai-whisper's writer option names).

    max_line_width: characters per line; max_line_count: lines per cue (None: 2, or 1 when max_words_per_line is
    set, as openai-whisper writes one-line cues then); max_words_per_line: word units per line (None: no limit);
    highlight_words: one cue per word, the word wrapped in <u>...</u> (needs word timestamps); max_cue_seconds:
    the longest cue; pause_seconds: a silence longer than this between two words ends a cue."""

    max_line_width: int = DEFAULT_LINE_WIDTH
    max_line_count: Optional[int] = None
    max_words_per_line: Optional[int] = None
    highlight_words: bool = False
    max_cue_seconds: float = MAX_CUE_SECONDS
    pause_seconds: float = PAUSE_SECONDS

    def __post_init__(self) -> None:
        _check_count("max_line_width", self.max_line_width, optional=False)
        _check_count("max_line_count", self.max_line_count)
        _check_count("max_words_per_line", self.max_words_per_line)
        if not isinstance(self.highlight_words, bool):
            raise ParameterError(f"highlight_words must be True or False, got {self.highlight_words!r}",
                                 "highlight_words")
        _check_seconds("max_cue_seconds", self.max_cue_seconds, "> 0", lambda value: value > 0)
        _check_seconds("pause_seconds", self.pause_seconds, ">= 0", lambda value: value >= 0)

    @property
    def lines_per_cue(self) -> int:
        if self.max_line_count is not None:
            return self.max_line_count
        return 1 if self.max_words_per_line is not None else DEFAULT_LINE_COUNT

    @property
    def words_per_line(self) -> float:
        return math.inf if self.max_words_per_line is None else self.max_words_per_line


def _check_count(name: str, value: Any, optional: bool = True) -> None:
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ParameterError(f"{name} must be an int >= 1{' or None' if optional else ''}, got {value!r}", name,
                             "an int >= 1")  # the requirement on a value given (None gives none)


def _check_seconds(name: str, value: Any, limit: str, holds: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or not holds(value):
        raise ParameterError(f"{name} must be a finite number of seconds {limit}, got {value!r}", name)


def subtitle_options(subtitles: Any = None, **fields: Any) -> SubtitleOptions:
    """SubtitleOptions from what a writer is given: None (the defaults), an int (max_words_per_line, the former
    argument of render / to_srt / to_vtt) or SubtitleOptions, with `fields` replacing some of their fields."""
    if subtitles is None:
        return SubtitleOptions(**fields)
    if isinstance(subtitles, SubtitleOptions):
        return dataclasses.replace(subtitles, **fields) if fields else subtitles
    if isinstance(subtitles, int) and not isinstance(subtitles, bool):
        return SubtitleOptions(**{"max_words_per_line": subtitles, **fields})
    raise ValueError(f"subtitle options must be SubtitleOptions, an int (max_words_per_line) or None, got "
                     f"{subtitles!r}")


@dataclasses.dataclass(frozen=True)
class _Unit:
    """A word, or a character of a CJK text, with its time; spaced: a space joins it to the unit before it."""

    start: float
    end: float
    text: str
    spaced: bool


def subtitle_cues(segments: Sequence[Any], options: SubtitleOptions) -> List[Cue]:
    """The cues of a transcript's segments (Segment: start, end, text, words), in order, timed as srt / vtt can
    show them (cue_timing.py: whole milliseconds, a minimal duration, no overlaps)."""
    cues: List[Cue] = []
    for block in _pause_blocks(_units(segments, options), options.pause_seconds):
        for group in _cue_groups(block, options):
            lines = _line_layout(group, options)
            cues.extend(_highlighted(lines, options) if options.highlight_words else [_cue(lines, options)])
    return shown_times(cues, options.max_cue_seconds)


# ------------------------------------------------------------------------------------------------ word units
def _units(segments: Sequence[Any], options: SubtitleOptions) -> List[_Unit]:
    """Every segment's word units in order: its timed words, or without them its text cut into words whose times
    are shared out over the segment by character count (approximate: Whisper gave no finer times)."""
    units: List[_Unit] = []
    for segment in segments:
        if segment.words:
            segment_units = [_Unit(word.start, word.end, word.word.strip(), word.word[:1].isspace())
                             for word in segment.words if word.word.strip()]
        elif not segment.text.strip():
            continue
        elif options.highlight_words:
            raise ValueError(f"highlight_words needs word timings (word_timestamps=True): the segment at "
                             f"{segment.start:.3f} s has none")
        else:
            segment_units = _interpolated(_split_text(segment.text), segment.start, segment.end)
        if units and segment_units and not segment_units[0].spaced:
            # a segment's text is stripped: a space joins it to the segment before, unless both sides are CJK
            cjk = _is_cjk(units[-1].text[-1]) and _is_cjk(segment_units[0].text[0])
            segment_units[0] = dataclasses.replace(segment_units[0], spaced=not cjk)
        units += segment_units
    return [piece for unit in units for piece in _hard_split(unit, options.max_line_width)]


def _is_cjk(char: str) -> bool:
    return any(low <= ord(char) <= high for low, high in _CJK_RANGES)


def _is_punctuation(text: str) -> bool:
    return all(unicodedata.category(char).startswith("P") for char in text)


def _is_opening(text: str) -> bool:
    return _is_punctuation(text) and unicodedata.category(text[0]) in ("Ps", "Pi")


def _split_text(text: str) -> List[Tuple[str, bool]]:
    """(text, spaced) of each word unit of `text`: runs of non-space characters, each CJK character alone;
    punctuation stays with the unit before it (opening brackets and quotes with the unit after it)."""
    parts: List[Tuple[str, bool]] = []
    prefix, prefix_spaced = "", False
    for match in _RUNS.finditer(text):
        spaced = match.start() > 0 and text[match.start() - 1].isspace()
        run = match.group()
        for piece in list(run) if any(_is_cjk(char) for char in run) else [run]:
            if _is_opening(piece):
                prefix_spaced = prefix_spaced if prefix else spaced
                prefix += piece
            elif prefix:
                parts.append((prefix + piece, prefix_spaced))
                prefix = ""
            elif parts and not spaced and (_is_punctuation(piece)
                                           or not (_is_cjk(piece[0]) or _is_cjk(parts[-1][0][-1]))):
                parts[-1] = (parts[-1][0] + piece, parts[-1][1])
            else:
                parts.append((piece, spaced))
            spaced = False
    if prefix:
        parts.append((prefix, prefix_spaced))
    return parts


def _interpolated(parts: Sequence[Tuple[str, bool]], start: float, end: float) -> List[_Unit]:
    """Units sharing start..end by their number of characters."""
    total = sum(len(text) for text, _ in parts)
    units, done = [], 0
    for text, spaced in parts:
        unit_start = start + (end - start) * done / total
        done += len(text)
        units.append(_Unit(unit_start, min(end, start + (end - start) * done / total), text, spaced))
    return units


def _hard_split(unit: _Unit, width: int) -> List[_Unit]:
    """A unit longer than a line cut into line-wide pieces (times shared by characters); others as they are."""
    if len(unit.text) <= width:
        return [unit]
    chunks = [(unit.text[k:k + width], unit.spaced and k == 0) for k in range(0, len(unit.text), width)]
    return _interpolated(chunks, unit.start, unit.end)


# ------------------------------------------------------------------------------------------------ cues and lines
def _pause_blocks(units: Sequence[_Unit], pause_seconds: float) -> List[List[_Unit]]:
    """The units cut wherever more than pause_seconds pass between one unit's end and the next one's start."""
    blocks: List[List[_Unit]] = []
    spoken_until = -math.inf  # the block's latest end (word times may overlap)
    for unit in units:
        if blocks and unit.start - spoken_until <= pause_seconds:
            blocks[-1].append(unit)
        else:
            blocks.append([unit])
        spoken_until = max(spoken_until, unit.end) if len(blocks[-1]) > 1 else unit.end
    return blocks


def _cue_groups(block: Sequence[_Unit], options: SubtitleOptions) -> List[Sequence[_Unit]]:
    """The block's units cut into cues, each as long as it can be (lines and duration), ending after punctuation
    instead when that keeps at least a third of its characters."""
    groups = []
    first = 0
    while first < len(block):
        stop = first + 1
        while stop < len(block) and _fits(block[first:stop + 1], options):
            stop += 1
        if stop < len(block):
            stop = _last_break(block[first:stop], _chars(block[first:stop]) / 3) + first
        groups.append(block[first:stop])
        first = stop
    return groups


def _fits(units: Sequence[_Unit], options: SubtitleOptions) -> bool:
    return (units[-1].end - units[0].start <= options.max_cue_seconds
            and len(_greedy_lines(units, options)) <= options.lines_per_cue)


def _chars(units: Sequence[_Unit]) -> int:
    """The width of the units on one line."""
    return sum(len(unit.text) for unit in units) + sum(unit.spaced for unit in units[1:])


def _last_break(units: Sequence[_Unit], least_chars: float) -> int:
    """Where to cut `units`: after the last unit ending with punctuation that leaves at least least_chars before
    the cut, else after all of them."""
    for cut in range(len(units), 0, -1):
        if units[cut - 1].text[-1] in BREAK_AFTER and _chars(units[:cut]) >= least_chars:
            return cut
    return len(units)


def _has_room(line: Sequence[_Unit], unit: _Unit, options: SubtitleOptions) -> bool:
    return len(line) < options.words_per_line and _chars(list(line) + [unit]) <= options.max_line_width


def _greedy_lines(units: Sequence[_Unit], options: SubtitleOptions) -> List[List[_Unit]]:
    """Lines filled in turn (the fewest lines the units fit on)."""
    lines: List[List[_Unit]] = [[]]
    for unit in units:
        if lines[-1] and not _has_room(lines[-1], unit, options):
            lines.append([])
        lines[-1].append(unit)
    return lines


def _line_layout(units: Sequence[_Unit], options: SubtitleOptions) -> List[List[_Unit]]:
    """The cue's lines: filled in turn, a full line ending after its last punctuation when that keeps it at least
    half wide; filled in turn without that preference if it would take more lines than a cue has."""
    lines: List[List[_Unit]] = []
    line: List[_Unit] = []
    for unit in units:
        if line and not _has_room(line, unit, options):
            cut = _last_break(line, options.max_line_width / 2)
            lines.append(line[:cut])
            line = line[cut:]
            if line and not _has_room(line, unit, options):
                lines.append(line)
                line = []
        line.append(unit)
    lines.append(line)
    return lines if len(lines) <= options.lines_per_cue else _greedy_lines(units, options)


def _line_text(line: Sequence[_Unit], highlighted: Optional[_Unit] = None) -> str:
    words = [f"<u>{unit.text}</u>" if unit is highlighted else unit.text for unit in line]
    text = "".join((" " if unit.spaced and k else "") + word for k, (unit, word) in enumerate(zip(line, words)))
    return text.replace("-->", "->")  # "-->" would read as a timing line


def _cue(lines: Sequence[Sequence[_Unit]], options: SubtitleOptions, highlighted: Optional[_Unit] = None) -> Cue:
    """A cue from its first unit's start to its last's end (a single unit is cut to max_cue_seconds)."""
    start = lines[0][0].start
    end = min(max(start, max(unit.end for line in lines for unit in line)), start + options.max_cue_seconds)
    return Cue(start, end, "\n".join(_line_text(line, highlighted) for line in lines))


def _highlighted(lines: Sequence[Sequence[_Unit]], options: SubtitleOptions) -> List[Cue]:
    """openai-whisper's highlight_words: per word, the cue's lines with that word underlined, from its start to its
    end; the plain lines fill the gaps between words."""
    plain = _cue(lines, options)
    cues: List[Cue] = []
    shown_until = plain.start
    for unit in (unit for line in lines for unit in line):
        if unit.start > shown_until:
            cues.append(Cue(shown_until, unit.start, plain.text))
        marked = _cue(lines, options, highlighted=unit)
        cues.append(Cue(unit.start, min(max(unit.start, unit.end), plain.end), marked.text))
        shown_until = max(shown_until, unit.end)
    return cues
