import enum

import grpc
import pytest
from dispo.libs.errors import FailedPrecondition
from dispo.libs.states import IllegalTransition, Transitions


class Light(enum.StrEnum):
    RED = "red"
    GREEN = "green"
    AMBER = "amber"
    OFF = "off"


class Other(enum.StrEnum):
    X = "x"


TABLE = Transitions(
    "light",
    {
        Light.RED: {Light.GREEN, Light.OFF},
        Light.GREEN: {Light.AMBER, Light.OFF},
        Light.AMBER: {Light.RED, Light.OFF},
        Light.OFF: set(),
    },
)


def test_a_declared_move_passes_and_an_undeclared_one_names_both_states():
    TABLE.check(Light.RED, Light.GREEN)
    with pytest.raises(IllegalTransition) as raised:
        TABLE.check(Light.RED, Light.AMBER)
    error = raised.value
    assert isinstance(error, FailedPrecondition)
    assert error.code == grpc.StatusCode.FAILED_PRECONDITION
    assert (error.machine, error.source, error.target) == ("light", Light.RED, Light.AMBER)
    assert error.message == "light state cannot move from red to amber"


def test_several_expected_states_must_each_allow_the_move():
    TABLE.check((Light.RED, Light.GREEN), Light.OFF)
    with pytest.raises(IllegalTransition) as raised:
        TABLE.check([Light.AMBER, Light.GREEN, Light.RED], Light.RED)
    assert raised.value.source == Light.GREEN  # the first source that may not move there
    with pytest.raises(ValueError):
        TABLE.check((), Light.OFF)


def test_final_states_have_no_way_out():
    assert TABLE.final == {Light.OFF}
    for state in Light:
        with pytest.raises(IllegalTransition):
            TABLE.check(Light.OFF, state)


def test_the_table_reads_as_a_mapping_and_answers_where_a_state_is_reached_from():
    assert set(TABLE) == set(Light)
    assert TABLE[Light.GREEN] == frozenset({Light.AMBER, Light.OFF})
    assert dict(TABLE.items())[Light.OFF] == frozenset()
    assert TABLE.allows(Light.AMBER, Light.RED) and not TABLE.allows(Light.RED, Light.RED)
    assert TABLE.sources(Light.OFF) == (Light.RED, Light.GREEN, Light.AMBER)


def test_a_table_must_cover_its_enum_and_stay_inside_it():
    with pytest.raises(ValueError, match="no entry for off"):
        Transitions("light", {Light.RED: set(), Light.GREEN: set(), Light.AMBER: set()})
    with pytest.raises(ValueError, match="another enum"):
        Transitions(
            "light",
            {Light.RED: {Other.X}, Light.GREEN: set(), Light.AMBER: set(), Light.OFF: set()},
        )
