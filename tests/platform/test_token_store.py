"""The token store's write of several tokens (the bootstrap's: ``dispo up``'s, the gateway's
on start, the compose init's): one statement for all, a token whose id is taken left as it
is (a revoked one stays revoked), on the real database as the gateway's role."""

from __future__ import annotations

from datetime import UTC, datetime

from dispo.auth import store
from dispo.libs.auth.tokens import Kind, new_secret, secret_hash
from support.auth import record


def _with_hash(kind: Kind, **fields: str):
    made = record(kind, **fields)
    return made, secret_hash(new_secret())


async def test_tokens_are_inserted_together_unless_their_id_is_taken(service_db):
    db = await service_db("gateway")  # the token store's writer; auth.* names are qualified
    first, second, third = (
        _with_hash(Kind.ADMIN),
        _with_hash(Kind.SERVICE, service="pool"),
        _with_hash(Kind.BUSINESS, business="tests"),
    )
    async with db.connection() as conn:
        assert await store.tokens_insert_if_absent(conn, [first, second]) == {
            first[0].token_id,
            second[0].token_id,
        }
        revoked = await store.token_revoke_if_live(conn, first[0].token_id, datetime.now(UTC))
        assert revoked is not None and revoked.revoked_at is not None

        # The first again (under another secret), with a new one: only the new one goes in.
        again = (first[0], secret_hash(new_secret()))
        assert await store.tokens_insert_if_absent(conn, [again, third]) == {third[0].token_id}
        assert await store.tokens_insert_if_absent(conn, []) == set()

        kept = await store.token_get(conn, first[0].token_id)
        listed = {t.token_id for t in await store.token_list(conn, include_revoked=True)}
    assert kept is not None and kept.revoked_at == revoked.revoked_at  # still revoked
    assert {first[0].token_id, second[0].token_id, third[0].token_id} <= listed
