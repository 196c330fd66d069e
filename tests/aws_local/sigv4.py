"""IAM authorization of a route (`AdminAuth: AWS_IAM`): the request must be signed with
Signature Version 4 for service `execute-api` by the one IAM principal this stack knows,
as API Gateway checks it. Anything else is API Gateway's 403 `{"message": "Forbidden"}`.

The principal's keys are fixed and printed by `tests/aws-local` (there is no IAM here):
sign with them as with any AWS keys, e.g. `curl --aws-sigv4 "aws:amz:us-east-1:execute-api"
--user "$ADMIN_ACCESS_KEY_ID:$ADMIN_SECRET_ACCESS_KEY"`.
"""

from __future__ import annotations

import hmac
import re
from urllib.parse import urlsplit

from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

REGION = "us-east-1"
ADMIN_ACCESS_KEY_ID = "AKIAAWSLOCALADMIN000"
ADMIN_SECRET_ACCESS_KEY = "aws-local-admin-secret"

_AUTHORIZATION = re.compile(
    r"AWS4-HMAC-SHA256 Credential=(?P<key>[^/]+)/(?P<date>\d{8})/(?P<region>[^/]+)/(?P<service>[^/]+)"
    r"/aws4_request, ?SignedHeaders=(?P<signed>[^,]+), ?Signature=(?P<signature>[0-9a-f]{64})"
)


def verify(method: str, url: str, headers: dict[str, str], body: bytes) -> bool:
    """Whether the request is signed by the admin principal (headers: lower-case names)."""
    found = _AUTHORIZATION.fullmatch(headers.get("authorization", "").strip())
    amz_date = headers.get("x-amz-date", "")
    if found is None or not amz_date:
        return False
    if (found["key"], found["region"], found["service"]) != (ADMIN_ACCESS_KEY_ID, REGION, "execute-api"):
        return False
    if found["date"] != amz_date[:8]:
        return False
    signed = found["signed"].split(";")
    # Signed again here from the headers it names, with the same date: equal or not.
    request = AWSRequest(
        method=method,
        url=url,
        data=body,
        headers={name: headers[name] for name in signed if name in headers},
    )
    signer = SigV4Auth(Credentials(ADMIN_ACCESS_KEY_ID, ADMIN_SECRET_ACCESS_KEY), "execute-api", REGION)
    request.context["timestamp"] = amz_date
    canonical = signer.canonical_request(request)
    string_to_sign = signer.string_to_sign(request, canonical)
    expected = signer.signature(string_to_sign, request)
    return hmac.compare_digest(expected, found["signature"]) and bool(urlsplit(url).netloc)
