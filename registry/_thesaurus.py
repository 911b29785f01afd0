"""Query expansion: groups of words an agent's request uses for what a tool's text says.

An agent asks "make the picture smaller"; the capability says "Resize or crop an
image". BM25 scores only shared words, so each query word also brings the other
words of its groups at a reduced weight (``EXPANSION_WEIGHT``): a word the
capability really uses still outranks a relative.

The groups are general vocabulary for the tools agents call (files, code,
messaging, calendars, machines, the web, media, home, money, time), not names of
particular capabilities. A group is a set of words that a user may put in each
other's place; a word may sit in several groups.
"""

from __future__ import annotations

from collections.abc import Callable

EXPANSION_WEIGHT = 0.5

GROUPS: tuple[str, ...] = (
    # finding and reading
    "find search look lookup locate query grep seek",
    "mention contain include refer",
    "read open view show display",
    "list enumerate all every",
    # making, changing, removing
    "create make new",
    "delete remove erase trash discard",
    "cancel delete remove",
    "update change modify edit move reschedule postpone push",
    "rename retitle",
    "copy duplicate clone",
    "convert transform turn",
    "combine merge join concatenate",
    "split separate divide",
    # running things
    "run execute exec invoke launch start",
    "stop kill terminate halt end quit",
    "restart reboot bounce",
    "install setup add",
    "outdated newer upgrade update stale",
    # files and code
    "file document doc",
    "folder directory dir",
    "code source codebase file repository repo",
    "diff change edit modification",
    "stash aside shelve",
    "blame author wrote who",
    "zip archive compress tar bundle",
    "unzip extract unpack decompress",
    "checksum hash digest sha256 verify",
    "test tests suite unit",
    "lint style linter",
    "format reformat prettify",
    # software delivery
    "ci pipeline workflow build actions checks",
    "pr pull request",
    "ticket issue bug",
    "release publish version tag",
    "package dependency library module",
    # messaging and people
    "email mail mailbox inbox message",
    "send post tell message notify",
    "reply respond answer",
    "react reaction emoji thumbs",
    "newsletter mailing unsubscribe",
    "contact person people phone number",
    "channel room team",
    # calendar and time
    "meeting event appointment standup call",
    "free available open slot",
    "tomorrow today tonight weekend date day upcoming next",
    "time clock hour",
    "timer countdown alarm minute",
    "todo task chore",
    "remind reminder",
    # machines and networks
    "reachable ping alive online offline responding unreachable down",
    "memory ram",
    "disk storage space drive",
    "cpu load processor busy",
    "process program app application",
    "service daemon unit",
    "status state health running",
    "log logs output",
    "ip address resolve dns",
    "domain website site url link",
    "port socket open",
    "expire expiry expiration registrant whois",
    "remote server host box machine",
    "container docker",
    "pod kubernetes k8s cluster",
    "replica instance scale",
    "database db sql postgres postgresql",
    "table column schema",
    "bucket s3 object",
    "cost spend spending bill",
    "download fetch retrieve",
    "upload send",
    "page webpage website",
    # media
    "picture image photo pic png jpeg jpg",
    "smaller shrink resize scale crop bigger enlarge thumbnail",
    "screenshot capture screen",
    "transcribe transcript dictation voice memo",
    "speak aloud loud spoken say pronounce",
    "music song track playlist album",
    "chart graph plot diagram",
    "spreadsheet sheet excel cell row",
    "pdf document",
    # the world
    "weather rain snow sunny temperature umbrella forecast",
    "directions route navigate commute travel airport station",
    "nearby near close around nearest closest",
    "place restaurant pharmacy cafe shop store hotel",
    "translate language",
    "news headline story",
    "paper article research publication",
    "define definition meaning mean",
    # home
    "light lamp bulb dim",
    "heating thermostat cooling degrees warm",
    "lock unlock door",
    # money
    "price cost quote worth value",
    "currency exchange dollar euro pound yen",
    "crypto cryptocurrency bitcoin ethereum coin",
    # secrets
    "password passphrase",
    "secret token credential key vault",
    "backup snapshot",
)


def build_expansions(tokenize: Callable[[str], list[str]]) -> dict[str, frozenset[str]]:
    """Each stemmed word to the stemmed words that share a group with it."""
    related: dict[str, set[str]] = {}
    for group in GROUPS:
        words = set(tokenize(group))
        for word in words:
            related.setdefault(word, set()).update(words - {word})
    return {word: frozenset(others) for word, others in related.items()}
