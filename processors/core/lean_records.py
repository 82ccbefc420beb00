"""Records of lean-decoded rollouts lines, as columns, by the reference's own plans.

:func:`records.extract_result` works out, per row *shape* (keys and value types, the usage's
too), where a record's values sit (``records._plan``, from the reference's rules). A lean row
(:func:`lean.decode_result`) has the same keys, order and number types, with placeholders
(:class:`lean.Obj`, ``Raw`` lists) for what the profile never reads, so the same plan reads it.
What a plan would read of a placeholder (a list or object ``reward`` written to
``rollout_infos``, an object ``mask_sample``, a list or object answer) makes the shape the
reference's, decided once per shape. The ``rollout_infos`` entries of a run of rows are
rendered with one ``orjson.dumps`` of their values (most of the per-row cost otherwise) and
one template per plan; their bytes are the reference's (``tests/test_lean.py``).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple

import orjson

from rewardstream.processors.core import lean
from rewardstream.processors.core.records import (
    NO_ANSWER,
    _Plan,
    _plan,
    answer_field,
    answer_id,
    row_shape,
)

__all__ = ["Columns", "Schema", "lean_results"]

Schema = tuple[tuple[str, ...], tuple[bool, ...]]
"""A record's column names and which hold ints (``ProfileState.schemas``' items)."""


class Columns(NamedTuple):
    """The records of consecutive lines, column by column (``values``: every row's column
    values back to back; ``infos``: the ``rollout_infos`` entries; ``agents``: each row's
    ``agent_ref.name`` when a string, as ``records.agent_of`` reads it, for the publisher)."""

    tasks: list[int]
    rollouts: list[int]
    schemas: list[Schema]
    masked: list[bool]
    answers: list[int]
    values: list[Any]
    infos: list[bytes]
    agents: list[str | None]


class _LeanPlan(NamedTuple):
    """A shape's :class:`records._Plan` and what the lean path adds: where the key sits, and
    the ``rollout_infos`` template (None: rendered per row, as the reference does, when an info
    key repeats or a string or null reward could hold the separators)."""

    plan: _Plan
    schema: Schema
    task: int
    rollout: int
    answer: int
    template: bytes | None
    agent: int


_TYPES = {lean.Obj: dict, lean.Skipped: dict}
_UNREAD = (lean.Obj, list)  # placeholders: their content is not decoded
_PLANS: dict[tuple[Any, ...], _LeanPlan | None] = {}
_MAX_PLANS = 4096  # as records._MAX_PLANS


def _lean_plan(shape: tuple[Any, ...], answer_key: str | None) -> _LeanPlan | None:
    """The plan of a lean row's shape, or None when the reference must read such rows."""
    keys, types, usage_keys, usage_types, usage_type = shape
    at = {k: i for i, k in enumerate(keys)}
    task, rollout = at.get("_ng_task_index", -1), at.get("_ng_rollout_index", -1)
    if task < 0 or rollout < 0 or types[task] is not int or types[rollout] is not int:
        return None  # the reference's message
    reward = types[at["reward"]] if "reward" in at else None
    if reward in _UNREAD:
        return None  # written raw into rollout_infos: not decoded
    if "mask_sample" in at and types[at["mask_sample"]] is lean.Obj:
        return None  # its truthiness is whether the object is empty: not decoded
    field = answer_field(answer_key)
    answer = at.get(field, -1) if field is not None else -1
    if answer >= 0 and types[answer] in _UNREAD:
        return None  # answer_id hashes the content
    plan = _plan(
        keys,
        tuple(_TYPES.get(t, t) for t in types),
        usage_keys,
        tuple(_TYPES.get(t, t) for t in usage_types),
        _TYPES.get(usage_type, usage_type),
    )
    if plan is None:
        return None
    template = None
    if reward is not str and len(set(plan.info_keys)) == len(plan.info_keys):
        template = b'{"rollout_id":"%d:%d","_ng_task_index":%d,"_ng_rollout_index":%d' + b"".join(
            b"," + orjson.dumps(k).replace(b"%", b"%%") + b":%s" for k in plan.info_keys[3:]
        )
        template += b"}"
    agent = at.get("agent_ref", -1)
    return _LeanPlan(plan, (plan.names, plan.is_int), task, rollout, answer, template, agent)


def lean_results(
    lines: Sequence[bytes | memoryview], flagged: set[int], answer_key: str | None
) -> Iterator[Columns | int]:
    """The lines' records in line order: runs of lines read here as :class:`Columns`, and the
    index of each line the reference must read (``flagged`` ones: :func:`lean.suspects`; ones
    msgspec refuses; shapes :func:`_lean_plan` leaves to it), in between."""
    decode, dumps, plans = lean.decode_result, orjson.dumps, _PLANS
    Obj = lean.Obj
    run = _Run()
    last: tuple[Any, ...] = ()
    current: _LeanPlan | None = None
    for i, line in enumerate(lines):
        row = None if i in flagged else decode(line)
        if row is not None:
            values = tuple(row.values())
            response = row.get("response")
            shape, used = row_shape(row, values, response.usage if type(response) is Obj else None)
            if shape != last:
                key = (shape, answer_key)
                if key not in plans and len(plans) >= _MAX_PLANS:
                    plans.clear()
                current = plans[key] if key in plans else plans.setdefault(key, _lean_plan(*key))
                last = shape
            if current is not None:
                run.add(current, values + used)
                continue
        if run.tasks:
            yield run.columns(dumps)
            run = _Run()
        yield i
    if run.tasks:
        yield run.columns(dumps)


class _Run:
    """Columns being gathered for consecutive lean rows; the info values wait for one
    ``orjson.dumps`` in :meth:`columns`."""

    def __init__(self) -> None:
        self.tasks: list[int] = []
        self.rollouts: list[int] = []
        self.schemas: list[Schema] = []
        self.masked: list[bool] = []
        self.answers: list[int] = []
        self.values: list[Any] = []
        self.plans: list[_LeanPlan] = []
        self.agents: list[str | None] = []
        self.info_values: list[Any] = []  # per row: its info values, or its entry (per-row plan)

    def add(self, lean_plan: _LeanPlan, every: tuple[Any, ...]) -> None:
        """One row, as ``records.extract_result`` reads it by its plan."""
        plan = lean_plan.plan
        task, rollout = every[lean_plan.task], every[lean_plan.rollout]
        found = plan.info_values(every)
        if plan.bools:
            found = tuple([int(v) if type(v) is bool else v for v in found])
        if plan.reward >= 0:
            found = (every[plan.reward], *found)
        entry: tuple[Any, ...] | bytes = found
        if lean_plan.template is None:
            head = (f"{task}:{rollout}", task, rollout)
            entry = orjson.dumps(dict(zip(plan.info_keys, head + found, strict=True)))
        self.tasks.append(task)
        self.rollouts.append(rollout)
        self.schemas.append(lean_plan.schema)
        self.masked.append(plan.mask >= 0 and bool(every[plan.mask]))
        self.answers.append(
            NO_ANSWER if lean_plan.answer < 0 else answer_id(every[lean_plan.answer])
        )
        self.values.extend(plan.column_values(every))
        self.plans.append(lean_plan)
        self.info_values.append(entry)
        ref = every[lean_plan.agent] if lean_plan.agent >= 0 else None
        name = ref.name if type(ref) is lean.Obj else None
        self.agents.append(name if type(name) is str else None)

    def columns(self, dumps: Any) -> Columns:
        """The gathered columns, each templated row's entry rendered from one ``dumps`` of all
        rows' info values (numbers, bools and null only: ``,`` and ``],[`` split them)."""
        listed = [v for v in self.info_values if type(v) is not bytes]
        parts = dumps(listed)[2:-2].split(b"],[") if listed else []
        infos: list[bytes] = []
        at = 0
        for plan, task, rollout, found in zip(
            self.plans, self.tasks, self.rollouts, self.info_values, strict=True
        ):
            if plan.template is None:
                infos.append(found)
                continue
            part = parts[at]
            at += 1
            args = (
                (task, rollout, task, rollout, *part.split(b","))
                if part
                else (task, rollout, task, rollout)
            )
            infos.append(plan.template % args)
        return Columns(
            self.tasks,
            self.rollouts,
            self.schemas,
            self.masked,
            self.answers,
            self.values,
            infos,
            self.agents,
        )
