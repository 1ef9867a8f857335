"""Custom search attributes: how a person finds a run's trajectories in the Web UI (or with
`temporal workflow list --query`), for instance the failed ones of one domain:

  ExecutionStatus = 'Failed' AND RollartRun = 'rollart-train-…' AND RollartDomain = 'frozenlake'

A namespace must know them before any workflow carries them: the embedded dev server is started
with them, and `register` adds them to a remote cluster (or says how to)."""

from __future__ import annotations

import re

from temporalio.common import SearchAttributeKey, SearchAttributePair, TypedSearchAttributes

RUN = SearchAttributeKey.for_keyword("RollartRun")
DOMAIN = SearchAttributeKey.for_keyword("RollartDomain")
GROUP = SearchAttributeKey.for_keyword("RollartGroup")
START_VERSION = SearchAttributeKey.for_int("RollartStartVersion")
FAILED_IN = SearchAttributeKey.for_keyword("RollartFailedIn")  # reset, generate, step or reward
GROUP_FROM = SearchAttributeKey.for_int("RollartGroupFrom")  # a lockstep batch's groups, by number
GROUP_TO = SearchAttributeKey.for_int("RollartGroupTo")

ALL: tuple[SearchAttributeKey, ...] = (RUN, DOMAIN, GROUP, START_VERSION, FAILED_IN, GROUP_FROM,
                                       GROUP_TO)


def type_name(key: SearchAttributeKey) -> str:
    """The type as the `temporal` CLI spells it (Keyword, Int)."""
    return key.indexed_value_type.name.title()


def dev_server_flags() -> list[str]:
    flags = []
    for key in ALL:
        flags += ["--search-attribute", f"{key.name}={type_name(key)}"]
    return flags


def of_run(run_id: str) -> TypedSearchAttributes:
    return TypedSearchAttributes([SearchAttributePair(RUN, run_id)])


def of_trajectory(run_id: str, domain: str, group_id: str,
                  start_version: int) -> TypedSearchAttributes:
    return TypedSearchAttributes([
        SearchAttributePair(RUN, run_id), SearchAttributePair(DOMAIN, domain),
        SearchAttributePair(GROUP, group_id), SearchAttributePair(START_VERSION, start_version)])


def of_batch(run_id: str, first_group: int, last_group: int) -> TypedSearchAttributes:
    """A batch's trajectories are not workflows: `rollart replay <trajectory id>` finds the
    batch that ran one by its group's number (a list of their ids would outgrow a search
    attribute's 2 KB)."""
    return TypedSearchAttributes([
        SearchAttributePair(RUN, run_id), SearchAttributePair(GROUP_FROM, first_group),
        SearchAttributePair(GROUP_TO, last_group)])


def batch_query(trajectory_id: str) -> str | None:
    """The visibility query for the batch that ran `trajectory_id`, from its id as the
    TrainingWorkflow makes them (`<run>.g<group number>.t<member>`); None for another id."""
    match = re.fullmatch(r"(?P<run>[^']+)\.g(?P<group>\d+)\.t\d+", trajectory_id)
    if match is None:
        return None
    group = int(match["group"])
    return (f"WorkflowType = 'BatchRolloutWorkflow' AND {RUN.name} = '{match['run']}' AND "
            f"{GROUP_FROM.name} <= {group} AND {GROUP_TO.name} >= {group}")


async def register(client, namespace: str) -> None:
    """Adds the attributes the namespace lacks. Raises a RuntimeError saying what to run (or to
    set temporal.search_attributes = false) where this client may not add them."""
    from temporalio.api.enums.v1 import IndexedValueType
    from temporalio.api.operatorservice.v1 import (
        AddSearchAttributesRequest,
        ListSearchAttributesRequest,
    )
    from temporalio.service import RPCError

    operator = client.operator_service
    try:
        known = await operator.list_search_attributes(
            ListSearchAttributesRequest(namespace=namespace))
        missing = [key for key in ALL if key.name not in known.custom_attributes]
        if missing:
            await operator.add_search_attributes(AddSearchAttributesRequest(
                namespace=namespace,
                search_attributes={key.name: IndexedValueType.Value(
                    f"INDEXED_VALUE_TYPE_{key.indexed_value_type.name}") for key in missing}))
    except RPCError as err:
        commands = "\n".join(
            f"  temporal operator search-attribute create --namespace {namespace} "
            f"--name {key.name} --type {type_name(key)}" for key in ALL)
        raise RuntimeError(
            f"temporal: could not register rollart's search attributes in namespace "
            f"{namespace!r} ({err.message}). Have an operator run:\n{commands}\n"
            "or set temporal.search_attributes = false (trajectories are then not searchable "
            "by run or domain)") from err
