"""Security building blocks: a lab CA, mutual TLS with roles for gRPC, CURVE for ZeroMQ.

Nothing here is switched on by itself: the controller, the agents, the operator client and
the fabric opt in (the emulated testbed may run without security). Two sides:

- issuing, once, on the host that keeps the CA key: :mod:`oddl.common.security.lab_ca`
  (``oddl certs init``), and :mod:`oddl.common.revocation` (revoke, rotate);
- run time, on every host: :mod:`oddl.common.security.files` (reading and checking the files),
  :mod:`oddl.common.security.revoked` (what is revoked),
  :mod:`oddl.common.security.tls` (gRPC credentials, peer identity),
  :mod:`oddl.common.security.authorization` (which role may call which RPC, the interceptor) and
  :mod:`oddl.common.security.curve` (ZeroMQ CURVE servers and clients).

Files (``oddl certs init --out DIR``, :func:`~oddl.common.security.lab_ca.init_lab_ca`)::

    DIR/manifest.json                 what was written, subjects, CURVE public keys (z85)
    DIR/tls/ca.crt, ca.key            the lab CA (keep ca.key on the machine that issues)
    DIR/tls/server.crt, server.key    the controller (SANs = --hosts), any lab TLS server
    DIR/tls/operator-NAME.crt, .key   one client certificate per operator (role operator)
    DIR/tls/agent-NODE.crt, .key      one client certificate per node agent (role agent)
    DIR/curve/SERVER.key, .key_secret CURVE pair of a ZeroMQ server (default: "fabric")
    DIR/curve/NODE.key, .key_secret   CURVE pair of a node (client of the fabric and of its
                                      peers' direct links, server of its own direct link)
    DIR/curve/operator-NAME.key, ...  CURVE pair of an operator tool (fabric statistics)

Private keys (``*.key`` under tls/, ``*.key_secret`` under curve/) are written 0600. TLS keys
are ECDSA P-256 in unencrypted PKCS#8 PEM; CURVE files use the ``zmq.auth`` certificate format
(``zmq.auth.load_certificate`` reads them). A host needs only its own files plus ``tls/ca.crt``
and ``manifest.json`` (which carries every CURVE public key).

Certificate subjects: ``O=oddl lab, OU=<role>, CN=<name>``; the role is ``operator``,
``agent`` or ``server``; an agent's CN is its node id, an operator's CN its name.

gRPC: :func:`server_credentials` (client certificates required), :func:`channel_credentials`,
:class:`AuthorizationInterceptor` (the method → roles table :data:`METHOD_RULES`; agent RPCs
must carry the caller's own ``node_id``), :func:`peer_identity`.

ZeroMQ: :class:`CurveServer` makes a ROUTER a CURVE server whose ZAP handler admits only the
listed client keys (and names each connection by its node: the ``User-Id`` frame property,
see :func:`sender_matches`); :func:`configure_curve_client` sets up a DEALER. Wiring:

- fabric ROUTER: ``CurveServer(files.curve_keys("fabric"), files.curve_clients())`` and
  ``server.configure(sock)`` before ``bind``; drop frames for which ``sender_matches`` is False.
- agent DEALERs to the fabric (identities ``node`` and ``node/tx``):
  ``configure_curve_client(sock, files.curve_keys(node), files.curve_public("fabric"))``
  before ``connect``.
- direct links: a node's ROUTER is ``CurveServer(files.curve_keys(node),
  files.curve_clients(operators=False))``; a DEALER to peer P uses
  ``configure_curve_client(sock, files.curve_keys(node), files.curve_public(P))``.
"""
