"""``dispo tokens``: issue, list and revoke API tokens through the gateway's TokenService.

dispo tokens create --business ecommerce [--expires 30d] [--label …]   a business's token
dispo tokens create --admin | --service reconciler                     an operator's, a service's
dispo tokens create --worker --queue tickets [--queue mail]            a worker's (its queues)
dispo tokens list [--business ecommerce] [--all]                       without secrets
dispo tokens revoke tok_…                                              refused from now on
dispo tokens rotate-secret --business ecommerce [--grace 24h]          a new signing secret
dispo tokens finish-rotation --business ecommerce                      the previous one retires
dispo tokens secrets [--business ecommerce]                            valid signing secrets

The caller's own token is ``--token``, else ``DISPO_TOKEN``, else the admin token ``dispo up``
wrote in the data folder; the gateway is ``--gateway``, else the running stack's, else
``DISPO_GATEWAY_*``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Annotated, Any

import typer
from dispo.libs.api.auth.v1 import auth_pb2 as pb
from dispo.libs.api.auth.v1 import auth_pb2_grpc
from dispo.tools.cli._common import (
    JSON_OPTION,
    REFUSED,
    as_dict,
    duration_seconds,
    err,
    fail,
    out,
    target,
    usage,
)

tokens_app = typer.Typer(
    help="Issue, list and revoke API tokens; rotate webhook signing secrets (admin).",
    no_args_is_help=True,
)


@tokens_app.callback()
def _tokens(
    ctx: typer.Context,
    gateway: Annotated[
        str | None, typer.Option(help="the gateway's address (default: the running stack's)")
    ] = None,
    as_json: JSON_OPTION = False,
) -> None:
    ctx.obj = {"gateway": gateway, "json": as_json}


@contextmanager
def _stub(ctx: typer.Context) -> Iterator[auth_pb2_grpc.TokenServiceStub]:
    where = target(ctx)
    if not where.token():
        fail(
            REFUSED,
            "no token",
            "pass --token, set DISPO_TOKEN, or run dispo up (it writes an admin token to"
            f" {where.data_dir / 'admin.token'})",
        )
    with where.channel("gateway", ctx.obj["gateway"]) as channel:
        yield auth_pb2_grpc.TokenServiceStub(channel)


def _line(token: pb.Token) -> str:
    kind = pb.TokenKind.Name(token.kind).removeprefix("TOKEN_KIND_").lower()
    bound = token.business or token.service or ",".join(token.queues)
    expires = token.expires_at.ToJsonString() if token.HasField("expires_at") else "never"
    revoked = " revoked " + token.revoked_at.ToJsonString() if token.HasField("revoked_at") else ""
    ceiling = f" max priority {token.max_priority}" if token.max_priority > 1 else ""
    return (
        f"{token.token_id:<22} {kind:<9} {bound:<16} expires {expires}{revoked}{ceiling}"
        f"  {token.label}"
    )


def _expires(text: str | None) -> int:
    return duration_seconds(text) if text else 0


@tokens_app.command()
def create(
    ctx: typer.Context,
    business: Annotated[
        str | None, typer.Option(help="a token of this business (its own tasks only)")
    ] = None,
    admin: Annotated[bool, typer.Option("--admin", help="an operator's token (every RPC)")] = False,
    service: Annotated[
        str | None, typer.Option(help="a service's credential (e.g. reconciler)")
    ] = None,
    worker: Annotated[
        bool, typer.Option("--worker", help="a worker's token: it serves its --queue(s) only")
    ] = False,
    queue: Annotated[
        list[str] | None, typer.Option(help="a queue a worker token serves (repeatable)")
    ] = None,
    expires: Annotated[
        str | None, typer.Option(help="lifetime: 90s, 15m, 12h, 30d (default: none)")
    ] = None,
    label: Annotated[str, typer.Option(help="who holds it")] = "",
    max_priority: Annotated[
        int,
        typer.Option(
            "--max-priority",
            help="a business token: the highest Submit priority it may ask for, 1 (any) to 5",
        ),
    ] = 0,
    as_json: JSON_OPTION = False,
) -> None:
    """A new token; its secret is printed once."""
    if sum((business is not None, admin, service is not None, worker)) != 1:
        usage("say whose token it is: one of --business, --admin, --service, --worker")
    if worker and not queue:
        usage("a worker token serves at least one --queue")
    if queue and not worker:
        usage("only a worker token (--worker) serves queues")
    ttl = _expires(expires)
    kind = (
        pb.TOKEN_KIND_ADMIN
        if admin
        else pb.TOKEN_KIND_SERVICE
        if service
        else pb.TOKEN_KIND_WORKER
        if worker
        else pb.TOKEN_KIND_BUSINESS
    )
    with _stub(ctx) as stub:
        reply = stub.CreateToken(
            pb.CreateTokenRequest(
                kind=kind,
                business=business or "",
                service=service or "",
                queues=queue or [],
                label=label,
                ttl_seconds=ttl,
                max_priority=max_priority,
            ),
            timeout=10,
        )
    if as_json or ctx.obj["json"]:
        shown: dict[str, Any] = {"token": as_dict(reply.token), "secret": reply.secret}
        if reply.signing_secret:
            shown["signing_secret"] = reply.signing_secret
            shown["signing_secret_info"] = as_dict(reply.signing_secret_info)
        print(json.dumps(shown, indent=2))
    else:
        print(reply.secret)
        note = f"{_line(reply.token)}\n(the secret above is shown this once)"
        if reply.signing_secret:
            print(reply.signing_secret)
            note += (
                "\nthe second line is the business's webhook signing secret, also shown"
                " this once (docs/security.md)"
            )
        err.print(note, highlight=False)


@tokens_app.command(name="list")
def list_(
    ctx: typer.Context,
    business: Annotated[str | None, typer.Option(help="only this business's tokens")] = None,
    all_: Annotated[bool, typer.Option("--all", help="revoked tokens too")] = False,
    as_json: JSON_OPTION = False,
) -> None:
    """Tokens without their secrets."""
    with _stub(ctx) as stub:
        listed = stub.ListTokens(
            pb.ListTokensRequest(business=business or "", include_revoked=all_), timeout=10
        )
    if as_json or ctx.obj["json"]:
        print(json.dumps([as_dict(t) for t in listed.tokens], indent=2))
    else:
        for item in listed.tokens:
            out.print(_line(item), highlight=False)


@tokens_app.command()
def revoke(
    ctx: typer.Context,
    token_id: Annotated[str, typer.Argument(help="the token's id (tok_…)")],
    as_json: JSON_OPTION = False,
) -> None:
    """Refuse the token from now on."""
    with _stub(ctx) as stub:
        revoked = stub.RevokeToken(pb.RevokeTokenRequest(token_id=token_id), timeout=10)
    if as_json or ctx.obj["json"]:
        print(json.dumps(as_dict(revoked.token), indent=2))
    else:
        out.print(_line(revoked.token), highlight=False)


def _secret_line(item: pb.SigningSecret) -> str:
    state = (
        "previous, valid until " + item.retires_at.ToJsonString()
        if item.HasField("retires_at")
        else "current"
    )
    return f"{item.secret_id:<22} {item.business:<16} {state}"


@tokens_app.command(name="rotate-secret")
def rotate_secret(
    ctx: typer.Context,
    business: Annotated[str, typer.Option(help="the business whose secret to rotate")],
    grace: Annotated[
        str | None,
        typer.Option(help="how long the previous secret stays valid at most (default 24h)"),
    ] = None,
    as_json: JSON_OPTION = False,
) -> None:
    """A new webhook signing secret for a business, printed once (its first, if none); the
    previous one stays valid until finish-rotation or the grace period ends."""
    seconds = _expires(grace)
    with _stub(ctx) as stub:
        rotated = stub.RotateSigningSecret(
            pb.RotateSigningSecretRequest(business=business, grace_seconds=seconds), timeout=10
        )
    if as_json or ctx.obj["json"]:
        print(json.dumps(as_dict(rotated), indent=2))
        return
    print(rotated.secret)
    lines = [_secret_line(rotated.current)]
    if rotated.HasField("previous"):
        lines.append(_secret_line(rotated.previous))
    lines.append("(the secret above is shown this once)")
    err.print("\n".join(lines), highlight=False)


@tokens_app.command(name="finish-rotation")
def finish_rotation(
    ctx: typer.Context,
    business: Annotated[str, typer.Option(help="the business whose rotation to finish")],
    as_json: JSON_OPTION = False,
) -> None:
    """The previous signing secret stops signing callbacks now."""
    with _stub(ctx) as stub:
        done = stub.FinishSigningSecretRotation(
            pb.FinishSigningSecretRotationRequest(business=business), timeout=10
        )
    if as_json or ctx.obj["json"]:
        print(json.dumps(as_dict(done.current), indent=2))
    else:
        out.print(_secret_line(done.current), highlight=False)


@tokens_app.command(name="secrets")
def secrets(
    ctx: typer.Context,
    business: Annotated[str | None, typer.Option(help="only this business's")] = None,
    as_json: JSON_OPTION = False,
) -> None:
    """Valid signing secrets, without the secrets."""
    with _stub(ctx) as stub:
        listed = stub.ListSigningSecrets(
            pb.ListSigningSecretsRequest(business=business or ""), timeout=10
        )
    if as_json or ctx.obj["json"]:
        print(json.dumps([as_dict(s) for s in listed.secrets], indent=2))
    else:
        for item in listed.secrets:
            out.print(_secret_line(item), highlight=False)
