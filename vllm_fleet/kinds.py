"""The input boundary: one checker for each kind of text an inventory, group data, a key file or the
workstation's environment gives vllm-fleet.

A value reaches systemd units, nginx's config, YAML, shell commands and file paths on every host,
so it is judged by what it is (a name, a host name, a path, a flag, a version, a URL, a secret), the
same way wherever it is used, and before anything is planned. Each checker returns None for a
good value and otherwise the problem, in words that can follow the key's name; the caller (config's
Checker) adds host, instance, key and the fix. Nothing here reaches a host.

Every string is checked for LINE_BREAKING first (config.host_checks.check_text): what follows assumes one line.
"""

from __future__ import annotations

import ipaddress
import math
import posixpath
import re
from typing import Any

# Characters that end a line for systemd (\n, \r, NUL), nginx, YAML or a shell, or that a terminal
# acts on: every C0/C1 control character, Unicode's line and paragraph separators, and the byte
# order mark (an editor's invisible first character of a key file).
LINE_BREAKING = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\ufeff]")

NAME_RE = re.compile(r"[A-Za-z0-9_-]{1,64}")
#: What clients send as "model": no space (vLLM's --served-model-name takes space-separated names),
#: no quote, backslash or '$' (it appears in JSON, nginx's config and shell commands), and no '-'
#: first (vLLM's parser would read the name as a flag).
SERVED_NAME_RE = re.compile(r"[A-Za-z0-9._:/@+=%,][A-Za-z0-9._:/@+=%,-]{0,199}")
USER_RE = re.compile(r"[a-z_][a-z0-9_-]{0,30}")
#: A Linux interface name (IFNAMSIZ: at most 15 characters), as NCCL_SOCKET_IFNAME takes it.
INTERFACE_RE = re.compile(r"[A-Za-z0-9_.-]{1,15}")
ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
FLAG_NAME_RE = re.compile(r"[a-z0-9][a-z0-9-]*")
#: X.Y, then word characters with a '.', '+' or '-' between two of them (0.33.0, 0.33.1rc1,
#: 1.2+cu129), written so that each character matches one way only: nested repetitions
#: (([.+-]?\w+)*) backtrack exponentially on a text that fails near its end.
# ASCII only: Unicode digits ("0.３３.0") are no version pip or vllm-fleet reads.
VERSION_RE = re.compile(r"\d+\.\d(\w|[.+-]\w)*", re.ASCII)
#: A pip requirement as the environment spec writes it: a name, extras, version specifiers.
REQUIREMENT_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]*(\[[A-Za-z0-9_.,\-]+\])?([=<>!~]=?[A-Za-z0-9_.*+\-]+,?)*")
# Printable ASCII without what a shell, a unit or pip's requirement files would read as syntax.
INDEX_URL_RE = re.compile(r"(https?|file)://[^\s'\"`$\\;<>{}|^\x80-\U0010ffff]+")
#: A Hugging Face model id ("org/name" or "name"), as the hub and vLLM take it.
HUB_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,95}(/[A-Za-z0-9][A-Za-z0-9._-]{0,95})?")
_DNS_NAME_RE = re.compile(r"(?=.{1,253}$)[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
                          r"(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*\.?")
# Inventory host names: DNS-like (pyinfra's names are often short aliases with '_'), an IP literal,
# or one of pyinfra's connectors (@local, @docker/<name>, ...). A name lands in unit comments, the
# YAML header, nginx's config and `vllm-fleet render --out` paths.
_INVENTORY_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,252}|@[a-z][a-z0-9_-]*(/[A-Za-z0-9][A-Za-z0-9._:-]*)?")
_SHELL_CHARS = re.compile(r"[\s;'\"$`\\*?\[\]{}()<>|&!#~%]")

#: Directories of the OS that no vllm-fleet path may be, nor contain: the deploy creates, chowns
#: and chmods its directories, and a model sync deletes what its source lacks. A path inside one of
#: them (/etc/vllm-fleet, /var/lib/vllm-fleet) is fine; one of them, or a parent of one, is not.
SYSTEM_DIRECTORIES = (
    "/", "/bin", "/boot", "/dev", "/etc", "/home", "/lib", "/lib32", "/lib64", "/libx32", "/media",
    "/mnt", "/opt", "/proc", "/root", "/run", "/sbin", "/srv", "/sys", "/tmp", "/usr", "/var",
    "/usr/bin", "/usr/lib", "/usr/lib64", "/usr/libexec", "/usr/local", "/usr/local/bin",
    "/usr/local/lib", "/usr/sbin", "/usr/share", "/usr/include", "/usr/src",
    "/var/lib", "/var/log", "/var/cache", "/var/tmp", "/var/spool", "/var/mail", "/var/opt",
    "/var/backups", "/var/local", "/var/run", "/var/lock", "/var/www",
    "/etc/systemd", "/etc/systemd/system", "/etc/ssh", "/etc/ssl", "/etc/sudoers.d", "/etc/pam.d",
    "/etc/security", "/etc/apt", "/etc/nginx", "/etc/default", "/etc/cron.d",
    "/lib/systemd", "/usr/lib/systemd", "/var/lib/dpkg", "/var/lib/apt", "/var/lib/systemd",
    "/var/log/journal",
)
_SYSTEM_SET = frozenset(SYSTEM_DIRECTORIES)
#: Linux takes at most NAME_MAX (255) bytes for one name of a path and PATH_MAX (4096) for a path;
#: a host path leaves room below it for the files and directories vllm-fleet puts there.
NAME_MAX_BYTES = 255
HOST_PATH_MAX_BYTES = 1024


def printable(text: Any) -> bool:
    """Whether text can go into an error message as it is: no character a terminal acts on, and
    no byte that is no UTF-8 character (read with surrogateescape; printing it fails)."""
    if not isinstance(text, str) or LINE_BREAKING.search(text):
        return False
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def name_problem(text: Any) -> str | None:
    """An instance name: it becomes the unit vllm-<name>.service and file names."""
    if isinstance(text, str) and NAME_RE.fullmatch(text):
        return None
    return f"{text!r} is not a name of letters, digits, '-' and '_' (1-64 characters)"


def served_name_problem(text: Any) -> str | None:
    if isinstance(text, str) and SERVED_NAME_RE.fullmatch(text):
        return None
    return (f"{text!r} is not a served model name: 1-200 characters without spaces, quotes, backslashes "
            "or '$' (letters, digits and . _ : / @ + = % , -), not starting with '-'")


#: Accounts the OS or a common package already runs something as (Debian's base-passwd, systemd's,
#: and the daemons a GPU server often has): a service user of vllm-fleet is one the deploy creates for
#: it alone, so these are refused before a host is reached (the deploy refuses any other existing
#: account that it did not create: vllm_fleet.rules.ownership.account_problem).
SYSTEM_ACCOUNTS = frozenset((
    "root", "daemon", "bin", "sys", "sync", "games", "man", "lp", "mail", "news", "uucp", "proxy",
    "www-data", "backup", "list", "irc", "gnats", "nobody", "nogroup", "_apt", "messagebus", "sshd", "polkitd",
    "systemd-network", "systemd-resolve", "systemd-timesync", "systemd-coredump", "systemd-journal",
    "systemd-oom", "tss", "uuidd", "tcpdump", "syslog", "avahi", "dnsmasq", "ntp", "chrony", "_chrony",
    "postfix", "nginx", "prometheus", "nvidia-persistenced", "docker", "lxd", "admin", "ubuntu", "debian",
    "adm", "sudo", "wheel", "staff", "users", "disk", "kmem", "shadow", "utmp", "video", "render", "audio",
))


def user_problem(text: Any) -> str | None:
    """A user vllm-fleet runs a service as: a user name that is not root and no account the OS or a
    common package already runs something as (SYSTEM_ACCOUNTS)."""
    if not (isinstance(text, str) and USER_RE.fullmatch(text)):
        return f"{text!r} is not a valid user name"
    if text == "root":
        return "root is not allowed: vLLM runs as a non-root user"
    if text in SYSTEM_ACCOUNTS:
        return (f"{text!r} is an account of the OS or of another package: what runs as it (and what it may "
                "read) would be vLLM's too")
    return None


def inventory_name_problem(name: Any) -> str | None:
    """An inventory host name."""
    if not isinstance(name, str) or not name:
        return f"host name {name!r} must be a non-empty string"
    if _INVENTORY_NAME_RE.fullmatch(name) and ".." not in name:
        return None
    if ip_literal(name) and "%" not in name:
        return None
    return f"host name {name!r} is not a DNS name, an IP address or a pyinfra connector (@local)"


def ip_literal(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def listen_address_problem(text: Any) -> str | None:
    """An address nginx listens on: an IP literal without a scope id (nginx takes none)."""
    if not isinstance(text, str) or not ip_literal(text):
        return f"{text!r} is not an IP address"
    if "%" in text:
        return f"{text!r} has an IPv6 scope id, which nginx's listen and systemd's IPAddressAllow= cannot take"
    address = ipaddress.ip_address(text)
    if address.version == 6 and address.ipv4_mapped:
        return (f"{text!r} is an IPv4 address written as IPv6, on which nginx cannot listen (its IPv6 "
                f"listeners take IPv6 only): write {str(address.ipv4_mapped)!r}")
    return None


def connect_address_problem(text: Any) -> str | None:
    """An address another host connects to: an IP literal (no scope id, not unspecified) or a DNS name."""
    if not isinstance(text, str):
        return f"{text!r} is not a host name or an IP address"
    if ip_literal(text):
        if "%" in text:
            return f"{text!r} has an IPv6 scope id, which nginx, vllm-router and systemd cannot take"
        if ipaddress.ip_address(text).is_unspecified:
            return f"{text!r} is no address another host can connect to"
        return None
    if _DNS_NAME_RE.fullmatch(text):
        return None
    return f"{text!r} is not a host name or an IP address another host can connect to"


#: A floating address as its CIDR: dotted IPv4 in ASCII digits without leading zeros, and the prefix
#: length of the gateways' subnet (what keepalived puts on the interface, and what the offline checks
#: read each gateway's subnet from).
_FLOATING_RE = re.compile(r"(?:(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])\.){3}"
                          r"(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])/(?:[0-9]|[12][0-9]|3[0-2])", re.ASCII)
#: The longest prefix a floating address may have: a /31 or /32 subnet has no address for a second
#: gateway beside the floating one.
FLOATING_MAX_PREFIX = 30
#: The shortest: keepalived puts a route to the address's whole subnet on the interface, and a /0 to
#: /7 one would take over the host's routes to much of the internet (its default route, at /0).
FLOATING_MIN_PREFIX = 8
#: RFC 1122's "this host on this network": a source address only, never one a client can reach.
THIS_NETWORK = ipaddress.IPv4Network("0.0.0.0/8")


def floating_address_problem(text: Any) -> str | None:
    """The gateways' floating address, as CIDR ("10.0.0.100/24"): IPv4 (keepalived's VRRP here is
    IPv4's), a host address of its subnet (not the network's or the broadcast address), an address a
    client can reach (not unspecified, loopback, link-local, multicast or reserved)."""
    if not isinstance(text, str) or not _FLOATING_RE.fullmatch(text):
        if isinstance(text, str) and ":" in text:
            return (f"{text!r} is an IPv6 address: the gateways' floating address is IPv4 only (VRRP for IPv6 "
                    "is another instance keepalived would need)")
        return (f"{text!r} is not an IPv4 address with its subnet's prefix length, e.g. '10.0.0.100/24' "
                "(ASCII digits, no leading zeros)")
    interface = ipaddress.IPv4Interface(text)
    address, network = interface.ip, interface.network
    if network.prefixlen < FLOATING_MIN_PREFIX:
        return (f"{text!r} has a /{network.prefixlen} subnet: keepalived adds the address with a route to "
                f"that whole subnet through the gateway's interface, which would take over routes to "
                f"{network}; give the gateways' own subnet's prefix (/{FLOATING_MIN_PREFIX} to /{FLOATING_MAX_PREFIX})")
    if network.prefixlen > FLOATING_MAX_PREFIX:
        return (f"{text!r} has a /{network.prefixlen} subnet: the gateways' own addresses must share the "
                "floating address's subnet, so it needs a prefix of /30 or shorter")
    if address in (network.network_address, network.broadcast_address):
        which = "network" if address == network.network_address else "broadcast"
        return f"{text!r} is the {which} address of {network}, not an address of a host"
    if address in THIS_NETWORK:
        return f"{text!r} is in {THIS_NETWORK} (\"this network\", a source address only): no client reaches a gateway there"
    for flag, what in (("is_unspecified", "unspecified"), ("is_loopback", "loopback"),
                       ("is_link_local", "link-local"), ("is_multicast", "multicast"), ("is_reserved", "reserved")):
        if getattr(address, flag):
            return f"{text!r} is a {what} address: no client reaches a gateway there"
    return None


def host_path_problem(text: Any) -> str | None:
    """A path on the host, used in units and shell commands: absolute, normalised, plain."""
    if not isinstance(text, str) or not text.startswith("/"):
        return f"{text!r} is not an absolute path"
    if _SHELL_CHARS.search(text):
        return f"{text!r} is not an absolute path without spaces or shell characters"
    if posixpath.normpath(text) != text or text.startswith("//"):
        return (f"{text!r} is not a normalised absolute path (no '.', '..', '//' or trailing '/'): "
                f"write {posixpath.normpath(text)!r}")
    size = len(text.encode("utf-8", "surrogatepass"))
    longest = max(len(part.encode("utf-8", "surrogatepass")) for part in text.split("/"))
    if size > HOST_PATH_MAX_BYTES or longest > NAME_MAX_BYTES:
        return (f"{text[:60]!r}... is {size} bytes long, its longest name {longest}: a path on the host has at "
                f"most {HOST_PATH_MAX_BYTES} bytes, each name at most {NAME_MAX_BYTES}")
    return None


#: Trees whose files root itself reads, runs or obeys: the OS's programs and libraries, its
#: configuration (/etc: what systemd, cron, sudo, PAM, apt and sshd read), root's and the users' homes,
#: the package managers' and systemd's state, spools root's daemons act on, the kernel's and
#: runtime files. No directory the deploy makes may be inside one: the service user would own what
#: root then obeys (a unit drop-in, a cron job, a program on root's PATH, a package's maintainer
#: script). vllm_config_dir (root's own, never the service user's) alone may be a directory of its own
#: directly below /etc (ROOT_CONFIG_PARENT), as /etc/vllm-fleet is.
ROOT_READ_TREES = (
    "/etc", "/usr", "/boot", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/root", "/home",
    "/proc", "/sys", "/dev", "/run", "/snap", "/var/spool", "/var/mail", "/var/log", "/var/backups",
    "/var/lib/dpkg", "/var/lib/apt", "/var/cache/apt", "/var/cache/debconf", "/var/lib/ucf",
    "/var/lib/systemd", "/var/lib/polkit-1", "/var/lib/sudo", "/var/lib/dbus", "/var/lib/pam",
    "/var/lib/nginx", "/var/lib/prometheus", "/var/lib/snapd", "/var/lib/rpm", "/var/lib/dnf",
    "/var/lib/yum", "/var/cache/dnf", "/var/cache/yum",
)
ROOT_CONFIG_PARENT = "/etc"


def managed_path_problem(text: Any, *, config_dir: bool = False) -> str | None:
    """A directory vllm-fleet creates and owns on the host (chown, chmod, deletes within it): a host
    path that is no system directory, contains none, and is inside no tree root reads
    (ROOT_READ_TREES; `config_dir`: root's own vllm_config_dir may also be directly below /etc)."""
    problem = host_path_problem(text)
    if problem:
        return problem
    if text in _SYSTEM_SET:
        return f"{text!r} is a system directory: the deploy would chown and chmod it"
    inside = next((d for d in SYSTEM_DIRECTORIES if d != "/" and d.startswith(text + "/")), None)
    if inside:
        return f"{text!r} contains the system directory {inside}: the deploy would chown and chmod it"
    if config_dir and posixpath.dirname(text) == ROOT_CONFIG_PARENT:
        return None
    tree = next((t for t in ROOT_READ_TREES if within(text, t)), None)
    if tree:
        return (f"{text!r} is inside {tree}, whose files root reads or runs: a directory of vllm-fleet's there "
                "could hand root's configuration or programs to the service user")
    return None


def config_dir_problem(text: Any) -> str | None:
    """vllm_config_dir: a managed directory, or one of its own directly below /etc."""
    return managed_path_problem(text, config_dir=True)


def within(path: str, parent: str) -> bool:
    """Whether the normalised absolute `path` is `parent` or inside it."""
    return path == parent or path.startswith(parent.rstrip("/") + "/")


#: The name of a workstation variable that holds a secret: capitals, digits and '_', as environment
#: variables are named (POSIX). Keys and tokens have lowercase letters (hex from openssl, base64, the
#: hub's hf_...), so a key pasted where its variable's name belongs is refused, not taken for a name
#: and printed in "$<key> is not set".
SECRET_ENV_NAME_RE = re.compile(r"[A-Z_][A-Z0-9_]{0,127}")


def secret_env_name_problem(text: Any) -> str | None:
    """The name of the variable a secret is read from. The value is never part of the message: it
    may be the secret itself."""
    if isinstance(text, str) and SECRET_ENV_NAME_RE.fullmatch(text):
        return None
    return ("the value (not shown: it may be the secret itself) is not the name of an environment variable in "
            "capitals (A-Z, digits and _, at most 128)")


def workstation_path_problem(text: Any) -> str | None:
    """A file on the workstation that holds a secret or a certificate: a path from / or ~ (a relative
    one would name another file in each directory vllm-fleet runs from, one inside a repository
    among them). The value is never part of the message: it may be the secret itself, pasted where
    its file's path belongs."""
    if not isinstance(text, str) or not text.strip():
        return "is empty (not shown: it may be the secret itself); give the file's path"
    if text != text.strip():
        return "has whitespace before or after it (not shown: it may be the secret itself)"
    if not (text.startswith("/") or text == "~" or text.startswith("~/")):
        return ("is not a path from / or ~ (not shown: it may be the secret itself): a relative path names "
                "another file in each directory vllm-fleet runs from")
    return None


def workstation_dir_problem(text: Any) -> str | None:
    """The workstation's own directory (the fleet CA, the hosts' key seed): a path from / or ~. Empty
    or relative, it would be the directory vllm-fleet runs from, and the fleet CA's private key would
    be written there (into a repository, often)."""
    if not isinstance(text, str) or not text.strip():
        return ("is empty: the fleet CA's private key and the seed of the hosts' keys would be written into "
                "whatever directory vllm-fleet runs from")
    if not (text.startswith("/") or text == "~" or text.startswith("~/")) or text != text.strip():
        return (f"{text!r} is not a path from / or ~: the fleet CA's private key and the seed of the hosts' "
                "keys would be written below whatever directory vllm-fleet runs from")
    return None


def flag_name_problem(text: Any) -> str | None:
    if isinstance(text, str) and FLAG_NAME_RE.fullmatch(text):
        return None
    return f"{text!r} is not a vllm serve flag name"


#: The words for True and False that engine_args may give a flag taking no value (what the planner
#: compares with its own True or False).
SWITCH_WORDS = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}


def switch_value(value: Any) -> bool | None:
    """True or False for a bool or one of SWITCH_WORDS; None for anything else."""
    if isinstance(value, bool):
        return value
    return SWITCH_WORDS.get(value.strip().lower()) if isinstance(value, str) else None


def _reads_as_flag(text: str) -> bool:
    """Whether vLLM's parser takes an argument for an option: argparse takes anything starting with
    '-' but '-' itself and a negative number, and vLLM's FlexibleArgumentParser reads '-x.y' (a
    negative decimal too) as a dotted option."""
    return text.startswith("-") and text != "-" and not re.fullmatch(r"-\d+", text)


def flag_value_problem(value: Any, *, takes_list: bool, takes_value: bool = True) -> str | None:
    """A value of a `vllm serve` flag in the engine YAML. vLLM's config loader writes True as the
    bare flag, turns a list into one argument per item after the flag and a dict into one JSON
    argument, and any other value into one argument (load_config_file in
    vllm/utils/argparse_utils.py): a list where the flag takes one value, a value for a flag that
    takes none, or an argument that reads as an option would become arguments of the writer's
    choosing (after the planner's own --host)."""
    if isinstance(value, float) and not math.isfinite(value):
        return f"{value!r} is not a finite number"
    if not takes_value:
        if switch_value(value) is None:
            return (f"{value!r} is not True or False: the flag takes no value, so vLLM would pass it as an "
                    "argument of its own")
        return None
    if isinstance(value, (int, float, str)) and not isinstance(value, bool) and _reads_as_flag(str(value)):
        return f"{value!r} starts with '-': vLLM's parser would read it as a flag"
    if value is None or isinstance(value, (bool, int, float, str)):
        return None
    if isinstance(value, (list, tuple)):
        if not takes_list:
            return "is a list, but this flag takes one value (each item would become its own argument)"
        for item in value:
            if not isinstance(item, (str, int, float)) or isinstance(item, bool):
                return f"list item {item!r} is not a string or a number"
            if _reads_as_flag(str(item)):
                return f"list item {item!r} starts with '-': vLLM's parser would read it as a flag"
        return None
    if isinstance(value, dict):
        return _json_problem(value)
    return f"{type(value).__name__} {value!r} is not a string, number, boolean, list or dict"


def _json_problem(value: Any) -> str | None:
    if isinstance(value, float) and not math.isfinite(value):
        return f"{value!r} is not a finite number"
    if value is None or isinstance(value, (bool, int, float, str)):
        return None
    if isinstance(value, (list, tuple)):
        return next(filter(None, map(_json_problem, value)), None)
    if isinstance(value, dict):
        if not all(isinstance(k, str) for k in value):
            return "a dict key is not a string"
        return next(filter(None, map(_json_problem, value.values())), None)
    return f"{type(value).__name__} {value!r} is not JSON"


#: No release's version is longer; a longer text of digits is none (and thousands of digits are more
#: than Python turns into a number).
VERSION_MAX_CHARS = 64


def version_problem(text: Any) -> str | None:
    if isinstance(text, str) and len(text) <= VERSION_MAX_CHARS and VERSION_RE.fullmatch(text):
        return None
    return f"{text!r} is not a version"


def version_tuple(text: str) -> tuple[int, ...]:
    """The release numbers of a version ("0.33.1rc1" -> (0, 33, 1))."""
    return tuple(int(part) for part in re.findall(r"\d+", text.split("+")[0])[:3])


def requirement_problem(text: Any) -> str | None:
    if isinstance(text, str) and REQUIREMENT_RE.fullmatch(text):
        return None
    return f"{text!r} is not a pip requirement (a name, optional [extras], version specifiers)"


def index_url_problem(text: Any) -> str | None:
    if isinstance(text, str) and INDEX_URL_RE.fullmatch(text):
        return None
    return f"{text!r} is not an index URL"


def model_reference_problem(text: Any) -> str | None:
    """A model or tokenizer: a Hugging Face id, or an absolute path on the host."""
    if not isinstance(text, str) or not text:
        return f"{text!r} is not a Hugging Face id or an absolute path"
    if text.startswith("/"):
        return host_path_problem(text)
    if HUB_ID_RE.fullmatch(text) and ".." not in text:
        return None
    return f"{text!r} is not a Hugging Face id ('org/name') or an absolute path"


def secret_problem(text: str) -> str | None:
    """An API key or token, as a client will send it. The value is never part of the message."""
    if not text or not text.strip():
        return "is empty or only whitespace"
    if text.startswith("\ufeff"):
        return "starts with a byte order mark (U+FEFF, from the editor that saved the key file)"
    if text != text.strip():
        return "has whitespace before or after it, which no client sends"
    found = LINE_BREAKING.search(text)
    if found:
        return f"holds a control character (at {found.start()}), which no HTTP header can carry"
    if not text.isascii():
        return "has a character outside ASCII, which HTTP clients do not send in a header"
    return None
