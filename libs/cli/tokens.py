"""``dispo tokens``: issue, list and revoke API tokens through the gateway's TokenService.

dispo tokens create --business ecommerce [--expires 30d] [--label …]   a business's token
dispo tokens create --admin | --service reconciler                     an operator's, a service's
dispo tokens list [--business ecommerce] [--all]                       without secrets
dispo tokens revoke tok_…                                              refused from now on

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


def run(args: argparse.Namespace, gateway: str, token: str, tls: ClientTLS | None = None) -> int:
    with open_sync_channel(gateway, token, tls=tls) as channel:
        stub = auth_pb2_grpc.TokenServiceStub(channel)
        try:
            return _run(args, stub)
        except grpc.RpcError as error:
            print(f"{error.code().name}: {error.details()}", file=sys.stderr)
            return 1


def _run(args: argparse.Namespace, stub: auth_pb2_grpc.TokenServiceStub) -> int:
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
            print(json.dumps({"token": _show(reply.token), "secret": reply.secret}, indent=2))
        else:
            print(reply.secret)
            print(f"{_line(reply.token)}\n(the secret above is shown this once)", file=sys.stderr)
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
    parser: argparse.ArgumentParser = tokens
    return parser
