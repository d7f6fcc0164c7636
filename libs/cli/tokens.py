"""``dispo tokens``: issue, list and revoke API tokens, and rotate the businesses' webhook
signing secrets, through the gateway's TokenService.

dispo tokens create --business ecommerce [--expires 30d] [--label …]   a business's token (its
                                                                       first: and its signing secret)
dispo tokens create --admin | --service reconciler                     an operator's, a service's
dispo tokens list [--business ecommerce] [--all]                       without secrets
dispo tokens revoke tok_…                                              refused from now on
dispo tokens rotate-secret --business ecommerce [--grace 24h]          a new signing secret
dispo tokens finish-rotation --business ecommerce                      the previous one retires
dispo tokens secrets [--business ecommerce]                            valid signing secrets

The caller's own token is ``--token``, else ``DISPO_TOKEN``, else the admin token ``dispo up``
wrote in the data folder; the gateway is the running stack's, else ``DISPO_GATEWAY_*``.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from typing import Any

import grpc
from dispo.libs.api.auth.v1 import auth_pb2 as pb
from dispo.libs.api.auth.v1 import auth_pb2_grpc
from dispo.libs.auth import open_sync_channel
from dispo.libs.tls import ClientTLS
from google.protobuf.json_format import MessageToDict

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_DURATION = re.compile(r"(\d+)([smhd])")


def duration_seconds(text: str) -> int:
    """``90s``, ``15m``, ``12h``, ``30d`` (or a number of seconds) in seconds."""
    if text.isdigit():
        return int(text)
    found = _DURATION.fullmatch(text.strip())
    if found is None or int(found.group(1)) == 0:
        raise argparse.ArgumentTypeError(f"not a duration: {text!r} (say 90s, 15m, 12h or 30d)")
    return int(found.group(1)) * _UNITS[found.group(2)]


def _show(token: pb.Token) -> dict[str, Any]:
    return MessageToDict(token, preserving_proto_field_name=True)


def _line(token: pb.Token) -> str:
    kind = pb.TokenKind.Name(token.kind).removeprefix("TOKEN_KIND_").lower()
    bound = token.business or token.service
    expires = token.expires_at.ToJsonString() if token.HasField("expires_at") else "never"
    revoked = " revoked " + token.revoked_at.ToJsonString() if token.HasField("revoked_at") else ""
    return f"{token.token_id:<22} {kind:<9} {bound:<16} expires {expires}{revoked}  {token.label}"


def _show_secret(item: Any) -> dict[str, Any]:
    return MessageToDict(item, preserving_proto_field_name=True)


def _secret_line(item: pb.SigningSecret) -> str:
    state = (
        "previous, valid until " + item.retires_at.ToJsonString()
        if item.HasField("retires_at")
        else "current"
    )
    return f"{item.secret_id:<22} {item.business:<16} {state}"


def _run_secrets(args: argparse.Namespace, stub: auth_pb2_grpc.TokenServiceStub) -> int:
    if args.tokens_command == "rotate-secret":
        rotated = stub.RotateSigningSecret(
            pb.RotateSigningSecretRequest(business=args.business, grace_seconds=args.grace or 0),
            timeout=10,
        )
        if args.json:
            print(json.dumps(_show_secret(rotated), indent=2))
            return 0
        print(rotated.secret)
        lines = [_secret_line(rotated.current)]
        if rotated.HasField("previous"):
            lines.append(_secret_line(rotated.previous))
        lines.append("(the secret above is shown this once)")
        print("\n".join(lines), file=sys.stderr)
        return 0
    if args.tokens_command == "finish-rotation":
        done = stub.FinishSigningSecretRotation(
            pb.FinishSigningSecretRotationRequest(business=args.business), timeout=10
        )
        print(
            json.dumps(_show_secret(done.current), indent=2)
            if args.json
            else _secret_line(done.current)
        )
        return 0
    listed = stub.ListSigningSecrets(
        pb.ListSigningSecretsRequest(business=args.business or ""), timeout=10
    )
    if args.json:
        print(json.dumps([_show_secret(s) for s in listed.secrets], indent=2))
    else:
        for item in listed.secrets:
            print(_secret_line(item))
    return 0


def run(args: argparse.Namespace, gateway: str, token: str, tls: ClientTLS | None = None) -> int:
    with open_sync_channel(gateway, token, tls=tls) as channel:
        stub = auth_pb2_grpc.TokenServiceStub(channel)
        try:
            return _run(args, stub)
        except grpc.RpcError as error:
            print(f"{error.code().name}: {error.details()}", file=sys.stderr)
            return 1


def _run(args: argparse.Namespace, stub: auth_pb2_grpc.TokenServiceStub) -> int:
    if args.tokens_command in ("rotate-secret", "finish-rotation", "secrets"):
        return _run_secrets(args, stub)
    if args.tokens_command == "create":
        kind = (
            pb.TOKEN_KIND_ADMIN
            if args.admin
            else pb.TOKEN_KIND_SERVICE
            if args.service
            else pb.TOKEN_KIND_BUSINESS
        )
        reply = stub.CreateToken(
            pb.CreateTokenRequest(
                kind=kind,
                business=args.business or "",
                service=args.service or "",
                label=args.label,
                ttl_seconds=args.expires or 0,
            ),
            timeout=10,
        )
        if args.json:
            shown: dict[str, Any] = {"token": _show(reply.token), "secret": reply.secret}
            if reply.signing_secret:
                shown["signing_secret"] = reply.signing_secret
                shown["signing_secret_info"] = _show_secret(reply.signing_secret_info)
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
            print(note, file=sys.stderr)
        return 0
    if args.tokens_command == "list":
        listed = stub.ListTokens(
            pb.ListTokensRequest(business=args.business or "", include_revoked=args.all),
            timeout=10,
        )
        if args.json:
            print(json.dumps([_show(t) for t in listed.tokens], indent=2))
        else:
            for item in listed.tokens:
                print(_line(item))
        return 0
    revoked = stub.RevokeToken(pb.RevokeTokenRequest(token_id=args.token_id), timeout=10)
    print(json.dumps(_show(revoked.token), indent=2) if args.json else _line(revoked.token))
    return 0


def add_parser(sub: Any) -> argparse.ArgumentParser:
    tokens = sub.add_parser("tokens", help="issue, list and revoke API tokens (admin)")
    tokens.add_argument("--gateway", help="the gateway's address (default: the running stack's)")
    tokens.add_argument("--json", action="store_true", help="JSON output")
    actions = tokens.add_subparsers(dest="tokens_command", required=True)
    create = actions.add_parser("create", help="a new token; its secret is printed once")
    who = create.add_mutually_exclusive_group(required=True)
    who.add_argument("--business", help="a token of this business (its own tasks only)")
    who.add_argument("--admin", action="store_true", help="an operator's token (every RPC)")
    who.add_argument("--service", help="a service's credential (e.g. reconciler)")
    create.add_argument(
        "--expires", type=duration_seconds, help="lifetime: 90s, 15m, 12h, 30d (default: none)"
    )
    create.add_argument("--label", default="", help="who holds it")
    listing = actions.add_parser("list", help="tokens without their secrets")
    listing.add_argument("--business", help="only this business's tokens")
    listing.add_argument("--all", action="store_true", help="revoked tokens too")
    revoke = actions.add_parser("revoke", help="refuse the token from now on")
    revoke.add_argument("token_id")
    rotate = actions.add_parser(
        "rotate-secret",
        help="a new webhook signing secret for a business, printed once (its first, if none);"
        " the previous one stays valid until finish-rotation or the grace period ends",
    )
    rotate.add_argument("--business", required=True)
    rotate.add_argument(
        "--grace",
        type=duration_seconds,
        help="how long the previous secret stays valid at most (default 24h)",
    )
    finish = actions.add_parser(
        "finish-rotation", help="the previous signing secret stops signing callbacks now"
    )
    finish.add_argument("--business", required=True)
    listed = actions.add_parser("secrets", help="valid signing secrets, without the secrets")
    listed.add_argument("--business", help="only this business's")
    parser: argparse.ArgumentParser = tokens
    return parser
