"""An SMTP server on loopback that requires AUTH (PLAIN or LOGIN) as
user `logbus`, password `s3cret`, and delivers to a Maildir.

    python3 smtpd_auth.py PORT MAILDIR
"""
import sys
import time

from aiosmtpd.controller import Controller
from aiosmtpd.handlers import Mailbox
from aiosmtpd.smtp import AuthResult, LoginPassword


def authenticate(server, session, envelope, mechanism, data):
    ok = (
        isinstance(data, LoginPassword)
        and data.login == b"logbus"
        and data.password == b"s3cret"
    )
    return AuthResult(success=ok, handled=False)


port, maildir = int(sys.argv[1]), sys.argv[2]
controller = Controller(
    Mailbox(maildir),
    hostname="127.0.0.1",
    port=port,
    authenticator=authenticate,
    auth_required=True,
    # Loopback only: the test checks the credentials, not the TLS (which
    # has its own test).
    auth_require_tls=False,
)
controller.start()
while True:
    time.sleep(3600)
