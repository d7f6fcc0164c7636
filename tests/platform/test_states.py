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


class Grown(enum.StrEnum):  # Light with a state added, as if no migration followed
    RED = "red"
    GREEN = "green"
    AMBER = "amber"
    OFF = "off"
    BLINKING = "blinking"


async def test_the_live_check_is_compared_with_the_enum_and_a_value_without_migration_shows(
    database_url,
):
    from dispo.libs.db import create_engine
    from dispo.libs.db.checks import enum_check_drift, enum_check_sql
    from dispo.libs.states import EnumCheck
    from sqlalchemy import text
    from sqlalchemy.exc import IntegrityError

    engine = create_engine(database_url, "checks_demo")
    try:
        async with engine.begin() as conn:
            await conn.execute(text("CREATE SCHEMA checks_demo"))
            await conn.execute(text("CREATE TABLE lights (state text NOT NULL)"))
            for sql in enum_check_sql(
                "lights", "state", "ck_light_state", [s.value for s in Light]
            ):
                await conn.execute(text(sql))
        declared = EnumCheck("lights", "state", "ck_light_state", Light)
        grown = EnumCheck("lights", "state", "ck_light_state", Grown)
        elsewhere = EnumCheck("other_table", "state", "ck_light_state", Light)
        async with engine.connect() as conn:
            assert await enum_check_drift(conn, "checks_demo", [declared]) == {}
            assert await enum_check_drift(conn, "checks_demo", [grown]) == {
                "ck_light_state": (declared.values, grown.values)
            }
            assert await enum_check_drift(conn, "checks_demo", [elsewhere]) == {
                "ck_light_state": (None, declared.values)
            }
        async with engine.begin() as conn:  # the migration that should have come
            for sql in enum_check_sql(
                "lights", "state", "ck_light_state", [s.value for s in Grown]
            ):
                await conn.execute(text(sql))
            with pytest.raises(IntegrityError, match="ck_light_state"):
                async with conn.begin_nested():
                    await conn.execute(text("INSERT INTO lights VALUES ('purple')"))
        async with engine.connect() as conn:
            assert await enum_check_drift(conn, "checks_demo", [grown]) == {}
    finally:
        await engine.dispose()
