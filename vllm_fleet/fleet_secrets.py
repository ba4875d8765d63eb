"""Every secret a fleet needs, read on the workstation before any host is reached, with every problem
of every host reported at once.

What is read, per host: each client's key (vllm_api_clients: key_env or key_file), or the fleet key
without clients (vllm_api_key_env, else vllm_api_key_file); the metrics token on a vllm_metrics or
vllm_monitoring host; on the monitoring host, each alert receiver's secrets (vllm_alert_receivers:
url_env, token_env, password_env); the Hugging Face token, when its variable is set; the seed of the hosts' own
keys in vllm_workstation_dir; with vllm_tls, the host's own certificate, key and CA files, or the
fleet CA there. `vllm-fleet check` reads them all without writing anything (`create=False`: a seed
or fleet CA not made yet is made by the first deploy); the deploy reads its host's (`create=True`)
once the fleet's check passed.

How each is judged:

- files through workstation_files.read_file: the user's own regular file, no link, no device or
  FIFO, size-bounded, writable by no one else, and a secret's readable by no other user;
- a key file holds the key alone, on one line (a file of several lines, or a PEM block, is another
  kind of file: an SSH key, a credentials file);
- a key or token as a client sends it (kinds.secret_problem), one nginx can hold
  (gateway.key_length_problem), and one no one guesses (strength_problem); the Hugging Face token is
  the hub's, judged by the first alone;
- no value in two roles: a client's key that is also another client's, the metrics token, the
  fleet key or the Hugging Face token would be handed out with both (config.fleet_checks refuses
  one variable or file read for two roles, before anything is read);
- TLS files parsed and matched with `cryptography` (tls.own_certificate).

No value is ever part of a message, nor a path that names nothing (it may be the key itself).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path

from vllm_fleet import host_keys, tls
from vllm_fleet.config import ConfigError, ConfigErrors, HostConfig
from vllm_fleet.config.alert_receivers import webhook_url_problem
from vllm_fleet.config.clients import FLEET_KEY_CLIENT
from vllm_fleet.gateway import key_length_problem
from vllm_fleet.kinds import secret_problem
from vllm_fleet.render import Secrets
from vllm_fleet.workstation_files import KEY_FILE_MAX_BYTES, PEM_MAX_BYTES, UnsafeFile, directory_problem, read_file, shown

#: The fewest characters a key or token of the fleet may have: `openssl rand -hex 8` gives 16, 64
#: random bits, which no one guesses through an HTTP endpoint (2^64 tries at 100,000 a second take
#: millions of years); below it are the placeholders ("test", "changeme", "sk-test").
MIN_KEY_CHARS = 16
#: ... and of different characters: "aaaaaaaaaaaaaaaa" is no key. 16 random hex digits have fewer than
#: 5 different ones about once in 2.4 million draws.
MIN_KEY_DISTINCT = 5
NEW_KEY = "openssl rand -hex 32"


def strength_problem(key: str) -> str | None:
    """Whether a key or token is too weak to guard the fleet (its length and its variety only: the
    value is never shown)."""
    if len(key) < MIN_KEY_CHARS:
        return (f"is shorter than {MIN_KEY_CHARS} characters: a placeholder, or a key someone could guess "
                "through the API")
    if len(set(key)) < MIN_KEY_DISTINCT:
        return f"has fewer than {MIN_KEY_DISTINCT} different characters: a placeholder, not a key"
    return None


def key_problem(key: str) -> str | None:
    """An API key's or the metrics token's problem: as clients send it, as nginx holds it, its strength."""
    return secret_problem(key) or key_length_problem(key) or strength_problem(key)


def key_file_text(data: bytes) -> tuple[str | None, str | None]:
    """(the key, None) of a key file's contents, or (None, what is wrong): the file holds the key alone,
    on one line (line breaks after it are fine)."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return None, "is not text (UTF-8): not a key file"
    lines = text.splitlines()
    while lines and not lines[-1].strip():
        lines.pop()
    if not lines:
        return None, "is empty: write the key into it, alone on its one line"
    if any(line.lstrip("\ufeff").startswith("-----BEGIN ") for line in lines):
        return None, "holds a PEM block (a private key or a certificate), not an API key"
    if len(lines) > 1:
        return None, (f"holds {len(lines)} lines: a key file holds the key alone, on one line (a file of several "
                      "lines is another kind of file: an SSH key, a credentials file)")
    return lines[0], None


class SecretReader:
    """Reads the secrets of one host after another, each source once (a client's key read for every
    host that has the client), keeping every problem (`errors`), each once with the hosts it
    concerns. `environ`: the workstation's environment (os.environ). `create`: make the seed of the
    hosts' keys and the fleet CA when missing (the deploy); without, nothing is written (check)."""

    def __init__(self, environ: Mapping[str, str] | None = None, *, create: bool = False):
        self.environ = os.environ if environ is None else environ
        self.create = create
        self._errors: dict[tuple, tuple[ConfigError, list[str]]] = {}
        self._files: dict[str, tuple[str | None, str | None, str]] = {}  # path -> (key, problem, fix)
        self._roles: dict[str, tuple[str, str, str, str]] = {}  # value -> (role, source, knob, host)
        self._checked: dict[tuple, list[ConfigError]] = {}  # TLS files and directories judged: their problems

    # --- problems --------------------------------------------------------------------------------

    def _add(self, error: ConfigError, host: str) -> None:
        """Keep `error` once (the same for several hosts: one error naming them)."""
        entry = self._errors.setdefault((error.instance, error.key, error.message, error.fix), (error, []))
        if host not in entry[1]:
            entry[1].append(host)

    def errors(self) -> list[ConfigError]:
        """Every problem found, in the order found; one that several hosts share names them all."""
        out = []
        for error, hosts in self._errors.values():
            message = error.message
            if len(hosts) > 1:
                message += f" (for hosts {', '.join(hosts)} alike)"
            out.append(ConfigError(message, host=hosts[0], instance=error.instance, key=error.key, fix=error.fix))
        return out

    def _count(self, host: str) -> int:
        return sum(host in hosts for _error, hosts in self._errors.values())

    # --- one host --------------------------------------------------------------------------------

    def host(self, config: HostConfig, trusted: list[HostConfig] | tuple[HostConfig, ...] = (),
             ssh_hostname: str | None = None) -> Secrets | None:
        """The host's secrets, or None where any of them has a problem (kept in `errors`). `trusted`:
        the hosts whose certificates it checks (the gateway's backends), whose CA files are read too;
        `ssh_hostname`: an address its certificate names (the fleet CA's)."""
        before = self._count(config.name)
        api_key, client_keys = None, []
        clients = config.api_clients
        settings = config.settings
        if len(clients) == 1 and clients[0].name == FLEET_KEY_CLIENT:
            api_key = self._api_key(config, "the fleet's API key", settings.vllm_api_key_env,
                                    settings.vllm_api_key_file, "vllm_api_key_env", "vllm_api_key_file")
        else:
            for client in clients:
                base = f"vllm_api_clients.{client.name}"
                key = self._api_key(config, f"client {client.name}'s key", client.key_env, client.key_file,
                                    f"{base}.key_env", f"{base}.key_file")
                client_keys.append((client.name, key))
        metrics_token = self._metrics_token(config)
        alert_secrets = self._alert_secrets(config)
        hf_token = self._hf_token(config)
        own_key = self._host_key(config)
        material = self._tls(config, list(trusted), ssh_hostname)
        if self._count(config.name) > before:
            return None
        return Secrets(api_key=api_key, hf_token=hf_token, client_keys=tuple(client_keys), host_key=own_key,
                       tls=material, metrics_token=metrics_token, alert_secrets=alert_secrets)

    def _role(self, value: str, role: str, source: str, knob: str, config: HostConfig) -> None:
        """`value` is `role`'s: refused when another role has it too."""
        other = self._roles.setdefault(value, (role, source, knob, config.name))
        if other[0] == role:
            return
        both_clients = role.startswith("client ") and other[0].startswith("client ")
        why = ("the fronts could not tell the two clients apart" if both_clients else
               "each is handed out where its role goes (a client's key to every front, the metrics token to "
               "Prometheus and every scraped host, the Hugging Face token to the hosts that download), so this "
               "value would go with both")
        self._add(ConfigError(f"{role} ({source}) has the same value as {other[0]} ({other[1]}, {other[2]} on host "
                              f"{other[3]}): {why}", host=config.name, key=knob,
                              fix=f"give {role} a value of its own (`{NEW_KEY}`)"), config.name)

    def _api_key(self, config: HostConfig, role: str, env: str | None, file: str | None, env_knob: str,
                 file_knob: str) -> str | None:
        """A key from the workstation's environment, else from its file (key_file_text), checked; None
        with the problem kept."""
        value = self.environ.get(env) if env else None
        if value:
            source, knob = f"${env}", env_knob
        elif file:
            source, knob = f"the file {shown(file)}", file_knob
            value, problem, fix = self._key_file(file)
            if problem:
                self._add(ConfigError(f"{role}: {source} {problem}", host=config.name, key=file_knob, fix=fix),
                          config.name)
                return None
        else:
            fix = (f"export {env}=$({NEW_KEY}) (or set vllm_api_key_file): the key every client sends"
                   if file_knob == "vllm_api_key_file" else
                   f"export {env}=$({NEW_KEY}), and hand that key to the client")
            self._add(ConfigError(f"no value for {role}: ${env} is not set on this workstation", host=config.name,
                                  key=env_knob, fix=fix), config.name)
            return None
        problem = key_problem(value)
        if problem:
            self._add(ConfigError(f"{role} ({source}) {problem}", host=config.name, key=knob,
                                  fix=f"use a random key of printable ASCII characters with nothing around it: `{NEW_KEY}`"),
                      config.name)
            return None
        self._role(value, role, source, knob, config)
        return value

    def _key_file(self, file: str) -> tuple[str | None, str | None, str]:
        """(key, problem, fix) of a key file, read once however many hosts name it."""
        path = str(Path(file).expanduser())
        if path not in self._files:
            try:
                key, problem = key_file_text(read_file(path, limit=KEY_FILE_MAX_BYTES, private=True))
                self._files[path] = (key, problem, "write the key alone into the file, on one line (mode 0600)")
            except UnsafeFile as exc:
                fix = exc.fix
                if exc.problem == "does not exist":  # a new client's key: how to make one
                    fix = ("create it with a new key alone on one line, readable by you alone: "
                           "`(umask 077; openssl rand -hex 32 > FILE)`; or point the knob at the file that holds it")
                self._files[path] = (None, exc.problem, fix)
        return self._files[path]

    def _metrics_token(self, config: HostConfig) -> str | None:
        """The metrics token of a vllm_metrics or vllm_monitoring host (None elsewhere): required,
        checked as an API key is, and no API key's value."""
        settings = config.settings
        if settings.vllm_metrics is not True and settings.vllm_monitoring is not True:
            return None
        env = settings.vllm_metrics_token_env
        token = self.environ.get(env)
        fix = f"export {env}=$({NEW_KEY}) on this workstation (the same for every deploy of the fleet)"
        if not token:
            self._add(ConfigError(f"no metrics token: ${env} is not set on this workstation (vllm_metrics needs "
                                  "one: Prometheus sends it for /metrics)", host=config.name,
                                  key="vllm_metrics_token_env", fix=fix), config.name)
            return None
        problem = key_problem(token)
        if problem:
            self._add(ConfigError(f"the metrics token (${env}) {problem}", host=config.name,
                                  key="vllm_metrics_token_env", fix=fix), config.name)
            return None
        self._role(token, "the metrics token", f"${env}", "vllm_metrics_token_env", config)
        return token

    def _alert_secrets(self, config: HostConfig) -> tuple[tuple[tuple[str, str], str], ...]:
        """Each alert receiver's secrets, ((receiver, key), value): required where named, judged as
        the service that receives them sends them (no whitespace or control character; a url_env a
        web URL), and no other role's value (a webhook would receive the metrics token or a key)."""
        out = []
        for receiver in config.alert_receivers:
            for key, env in receiver.secret_envs():
                knob = f"vllm_alert_receivers.{receiver.name}.{key}"
                role = f"alert receiver {receiver.name}'s {key.removesuffix('_env')}"
                value = self.environ.get(env)
                if not value:
                    self._add(ConfigError(f"no value for {role}: ${env} is not set on this workstation",
                                          host=config.name, key=knob,
                                          fix=f"export {env}=<the {key.removesuffix('_env')} the receiver's service "
                                              "gave you> on this workstation"), config.name)
                    continue
                problem = secret_problem(value)
                if key == "url_env" and not problem:
                    problem = webhook_url_problem(value, secret=True)
                if problem:
                    self._add(ConfigError(f"{role} (${env}) {problem}", host=config.name, key=knob,
                                          fix=f"export {env}=<the value alone, without whitespace or line breaks"
                                              + (": an http(s) URL>" if key == "url_env" else ">")), config.name)
                    continue
                self._role(value, role, f"${env}", knob, config)
                out.append(((receiver.name, key), value))
        return tuple(out)

    def _hf_token(self, config: HostConfig) -> str | None:
        """The Hugging Face token, when its variable is set: the hub's to judge, so only as a header
        carries it; and no other role's value (it goes to every host that downloads)."""
        env = config.settings.vllm_hf_token_env
        token = self.environ.get(env) or None
        if token is None:
            return None
        problem = secret_problem(token)
        if problem:
            self._add(ConfigError(f"the Hugging Face token (${env}) {problem}", host=config.name,
                                  key="vllm_hf_token_env", fix=f"export {env}=<the token as the hub shows it>"),
                      config.name)
            return None
        self._role(token, "the Hugging Face token", f"${env}", "vllm_hf_token_env", config)
        return token

    # --- the workstation's own keys ----------------------------------------------------------------

    def _host_key(self, config: HostConfig) -> str | None:
        """The host's own key (host_keys), its seed made when missing only with `create`."""
        try:
            if self.create:
                return host_keys.host_key(config)
            host_keys.read_seed(config, create=False)
        except ConfigErrors as exc:
            for error in exc.errors:
                self._add(error, config.name)
        return None

    def _tls(self, config: HostConfig, trusted: list[HostConfig], ssh_hostname: str | None):
        """The host's TLS material (tls.host_tls) with `create`; without, its files and the CAs it
        trusts judged, nothing made. None without vllm_tls, or with a problem kept."""
        if config.settings.vllm_tls is not True:
            return None
        if self.create:
            try:
                return tls.host_tls(config, trusted, ssh_hostname)
            except ConfigErrors as exc:
                for error in exc.errors:
                    self._add(error, config.name)
                return None
        for each in [config, *trusted]:  # its own files, and the CAs of the hosts it checks
            if each.settings.vllm_tls is not True:
                continue
            own = each.name == config.name
            if each.settings.vllm_tls_cert_file:
                files = tuple(each.settings[knob] for knob in tls.OWN_FILES)
                what, judge = (("own", files), tls.own_certificate) if own else (("ca", files[2]), tls.own_ca)
            else:
                what, judge = ("fleet ca", str(tls.ca_dir(each))), self._fleet_ca
            if what not in self._checked:
                try:
                    judge(each)
                    self._checked[what] = []
                except ConfigErrors as exc:
                    self._checked[what] = exc.errors
            for error in self._checked[what]:
                self._add(error, config.name)
        return None

    def _fleet_ca(self, config: HostConfig) -> None:
        """The fleet CA as the deploy will use it, judged without writing: its directory, and its
        certificate and key where they exist (parsed, and the key the certificate's)."""
        from cryptography import x509
        from cryptography.hazmat.primitives import serialization

        directory = tls.ca_dir(config)
        errors = []
        for each in (directory.parent, directory, directory / "hosts"):
            problem = directory_problem(each)
            if problem:
                errors.append(ConfigError(f"the workstation's directory {shown(each)} {problem[0]}", host=config.name,
                                          key="vllm_workstation_dir", fix=problem[1]))
        cert_path, key_path = directory / tls.CA_CERT, directory / tls.CA_KEY
        if not errors and os.path.lexists(cert_path) and os.path.lexists(key_path):
            try:
                cert = x509.load_pem_x509_certificate(read_file(cert_path, limit=PEM_MAX_BYTES, private=False))
                key = serialization.load_pem_private_key(read_file(key_path, limit=PEM_MAX_BYTES, private=True),
                                                         password=None)
                spki = (serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
                if cert.public_key().public_bytes(*spki) != key.public_key().public_bytes(*spki):
                    raise ValueError("mismatch")
            except UnsafeFile as exc:
                errors.append(ConfigError(f"the fleet CA's file in {shown(directory)} {exc.problem}", host=config.name,
                                          key="vllm_workstation_dir", fix=exc.fix))
            except (ValueError, TypeError):
                errors.append(ConfigError(
                    f"the fleet CA in {shown(directory)}: its certificate and key do not parse, or are no pair",
                    host=config.name, key="vllm_workstation_dir",
                    fix="restore both files from the workstation that made them (or remove the directory: a new CA, "
                        "which every client must then trust)"))
        if errors:
            raise ConfigErrors(errors)


def trusted_hosts(config: HostConfig, every: Callable[[], list[HostConfig]]) -> list[HostConfig]:
    """The hosts whose certificates `config` checks: on the gateway host every host of the fleet
    (its backends), elsewhere none but itself."""
    return every() if config.settings.vllm_gateway is True else []


def check_secrets(configs: list[HostConfig], every: Callable[[], list[HostConfig]],
                  environ: Mapping[str, str] | None = None) -> list[ConfigError]:
    """Every problem of every secret of `configs` (every(): the fleet's hosts, whose CAs the gateway
    trusts), reading only: nothing is written, nothing is reached."""
    reader = SecretReader(environ, create=False)
    for config in configs:
        reader.host(config, trusted_hosts(config, every))
    return reader.errors()


def read_host_secrets(config: HostConfig, trusted: list[HostConfig] | None = None, ssh_hostname: str | None = None,
                      environ: Mapping[str, str] | None = None) -> Secrets:
    """One host's secrets as the deploy uses them (the seed and the fleet CA made when missing).
    ConfigErrors with every problem."""
    reader = SecretReader(environ, create=True)
    secrets = reader.host(config, trusted or [], ssh_hostname)
    if secrets is None:
        raise ConfigErrors(reader.errors())
    return secrets
