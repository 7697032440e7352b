"""Where Drizzle's Transaction messages wait: `AmqpSource`, a queue on a RabbitMQ broker,
parsed from `drizzle+amqp://[USER[:PASSWORD]@]HOST[:PORT]/QUEUE[?vhost=NAME]`.

>>> source = AmqpSource.parse("drizzle+amqp://app:secret@mq.example:5673/orders?vhost=shop")
>>> str(source), source.queue, source.vhost
('drizzle+amqp://app@mq.example:5673/orders?vhost=shop', 'orders', 'shop')
"""

from __future__ import annotations

from dataclasses import dataclass, field
from urllib.parse import parse_qs, quote, unquote, urlsplit

from replicator.errors import ConfigError

SCHEME = "drizzle+amqp"
DEFAULT_PORT = 5672
DEFAULT_VHOST = "/"
DEFAULT_USER = "guest"
DEFAULT_PASSWORD = "guest"
"""RabbitMQ's built-in account; the broker accepts it from localhost only."""


@dataclass(frozen=True, slots=True)
class AmqpSource:
    """Where Drizzle's Transaction messages wait: a queue on a RabbitMQ broker.

    `str()` is the connection string without the password; `repr()` hides it too.
    """

    host: str
    queue: str
    port: int = DEFAULT_PORT
    vhost: str = DEFAULT_VHOST
    username: str = DEFAULT_USER
    password: str = field(default=DEFAULT_PASSWORD, repr=False)

    def __post_init__(self) -> None:
        if not self.host:
            raise ConfigError("an AMQP source needs a host")
        if not self.queue:
            raise ConfigError(f"an AMQP source on {self.node} needs a queue name")
        if not 0 < self.port < 65536:
            raise ConfigError(f"AMQP port {self.port} is not between 1 and 65535")

    @classmethod
    def parse(
        cls, url: str, *, username: str | None = None, password: str | None = None
    ) -> AmqpSource:
        """Read `drizzle+amqp://[USER[:PASSWORD]@]HOST[:PORT]/QUEUE[?vhost=VHOST]`.

        User, password, queue and vhost are percent-decoded (a vhost `/` is `%2F` or `/`; a
        queue name may contain `/`). Without a user: `guest`/`guest`, which RabbitMQ accepts
        from localhost only. `password` supplies the password from elsewhere (a file, the
        environment) so that it need not be in the string, which shows in process lists, and
        `username` the user (a setting of its own); giving either in both places is an error.

        >>> AmqpSource.parse("drizzle+amqp://localhost/tx").vhost
        '/'
        """
        # Errors below name components, never the string itself: a password with a raw '/',
        # '?' or '#' in it would spill into the path, query or fragment.
        parts = urlsplit(url)
        if parts.scheme != SCHEME:
            shown = parts.scheme or "none"
            raise ConfigError(
                f"an AMQP source starts {SCHEME}://, not with scheme {shown!r} "
                f"(expected {SCHEME}://[USER[:PASSWORD]@]HOST[:PORT]/QUEUE[?vhost=VHOST])"
            )
        host = parts.hostname
        if not host:
            raise ConfigError(f"the {SCHEME} source names no host")
        try:
            port = parts.port or DEFAULT_PORT
        except ValueError:
            raise ConfigError(
                f"the {SCHEME} source for host {host!r} has a port that is not a number between "
                "0 and 65535 (a password with ':', '/', '?', '#' or '@' must be percent-encoded)"
            ) from None
        queue = unquote(parts.path[1:]) if parts.path.startswith("/") else ""
        if not queue:
            raise ConfigError(
                f"the {SCHEME} source for host {host!r} names no queue: add /QUEUE after the host"
            )
        if parts.fragment:
            raise ConfigError(
                f"the {SCHEME} source for host {host!r} has a '#' part, which means nothing "
                "here (a password with '#' must be percent-encoded as %23)"
            )
        vhost = _vhost(parts.query, host)
        url_username = unquote(parts.username) if parts.username is not None else None
        if url_username is not None and username is not None:
            raise ConfigError(
                f"the {SCHEME} source for host {host!r} names a user, and a user was given "
                "separately as well: give it once"
            )
        username = username if username is not None else url_username
        url_password = unquote(parts.password) if parts.password is not None else None
        if url_password is not None and password is not None:
            raise ConfigError(
                f"the {SCHEME} source for host {host!r} carries a password, and a password was "
                "given separately as well: give it once"
            )
        chosen = password if password is not None else url_password
        if username is None:
            if chosen is not None:
                raise ConfigError(
                    f"the {SCHEME} source for host {host!r} has a password but no user"
                )
            username, chosen = DEFAULT_USER, DEFAULT_PASSWORD
        if not username:
            raise ConfigError(f"the {SCHEME} source for host {host!r} has an empty user name")
        return cls(
            host=host,
            queue=queue,
            port=port,
            vhost=vhost,
            username=username,
            password=chosen if chosen is not None else "",
        )

    @property
    def node(self) -> str:
        """host:port, as errors name the broker."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    def url(self, *, with_password: bool = False) -> str:
        """The connection string; the password only when asked (to hand to a child process
        through a channel that is not a command line or a log)."""
        userinfo = quote(self.username, safe="")
        if with_password:
            userinfo += ":" + quote(self.password, safe="")
        query = "" if self.vhost == DEFAULT_VHOST else "?vhost=" + quote(self.vhost, safe="")
        return f"{SCHEME}://{userinfo}@{self.node}/{quote(self.queue, safe='')}{query}"

    def __str__(self) -> str:
        return self.url()

    def with_queue(self, queue: str) -> AmqpSource:
        """The same broker, vhost and user; another queue."""
        return AmqpSource(self.host, queue, self.port, self.vhost, self.username, self.password)

    def where(self) -> str:
        return f"queue {self.queue!r} in vhost {self.vhost!r}"


def _vhost(query: str, host: str) -> str:
    if not query:
        return DEFAULT_VHOST
    try:
        values = parse_qs(query, keep_blank_values=True, strict_parsing=True)
    except ValueError:
        raise ConfigError(
            f"the {SCHEME} source for host {host!r} has a query that is not NAME=VALUE pairs; "
            "the only one understood is vhost=VHOST"
        ) from None
    unknown = sorted(set(values) - {"vhost"})
    if unknown:
        raise ConfigError(
            f"the {SCHEME} source for host {host!r} has {len(unknown)} unknown query "
            "parameter(s); the only one understood is vhost=VHOST"
        )
    vhosts = values["vhost"]
    if len(vhosts) != 1 or not vhosts[0]:
        raise ConfigError(
            f"the {SCHEME} source for host {host!r} must give vhost= once, with a name "
            "(%2F for the default vhost '/')"
        )
    return vhosts[0]
