"""One TLS context for every HTTP client toolenv makes (`tls_context`).

httpx builds a new `ssl.SSLContext` for each client not given one: loading the CA
bundle costs milliseconds a client, and building one is unsafe in a child forked while
another thread of the parent was inside OpenSSL, which Gymnasium's AsyncVectorEnv does
(it forks its workers from a process with threads, and a `RemoteToolEnv` built in a worker
hung in `SSLContext.__new__`). A context built once is shared by every client, in this
process and in the children forked after it, as httpx's docs advise.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # `import toolenv` stays light: ssl and httpx load on first use
    import ssl

__all__ = ["tls_context"]


@functools.cache
def tls_context() -> ssl.SSLContext:
    """httpx's default context (certifi's CA bundle, or `SSL_CERT_FILE`/`SSL_CERT_DIR`), built once."""
    import httpx

    return httpx.create_ssl_context()
