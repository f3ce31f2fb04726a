# Sourced by tests/nvidia-userspace/fetch.sh and tests/vm/cuse-vm (bash): finds the Debian
# mirror this machine's apt is configured with, so that an apt source the scripts add uses the
# same mirror as the machine's own (no mirror host is written into this repository).
#
#   debian_mirror ARCHIVE     ARCHIVE: "debian" or "debian-security"
#
# Prints the first URI, without a trailing slash, of an enabled `deb` source whose path ends
# in /ARCHIVE, reading the one-line format of /etc/apt/sources.list and
# /etc/apt/sources.list.d/*.list and the deb822 format of /etc/apt/sources.list.d/*.sources
# (stanzas with `Types: deb`, not `Enabled: no`). Prints nothing and returns 1 when there is
# none. DEBIAN_MIRROR_APT_DIR replaces /etc/apt (for testing).

debian_mirror() {
  local archive=$1 dir=${DEBIAN_MIRROR_APT_DIR:-/etc/apt} f uri
  for f in "$dir/sources.list" "$dir"/sources.list.d/*.list "$dir"/sources.list.d/*.sources; do
    [[ -f $f ]] || continue
    uri=$(awk -v archive="$archive" -v deb822="$([[ $f == *.sources ]] && echo 1 || echo 0)" '
      function check(u) {
        sub(/\/+$/, "", u)
        if (!found && u ~ ("^[a-z0-9+]+://[^/]+(/.*)?/" archive "$")) { print u; found = 1 }
      }
      function stanza_end(   n, i, us) {
        if (types ~ /(^|[[:space:]])deb([[:space:]]|$)/ && tolower(enabled) != "no") {
          n = split(uris, us, /[[:space:]]+/)
          for (i = 1; i <= n; i++) if (us[i] != "") check(us[i])
        }
        types = ""; uris = ""; enabled = ""
      }
      /^[[:space:]]*#/ { next }
      deb822 == 0 {
        if ($1 != "deb") next
        i = 2
        if ($2 ~ /^\[/) { while (i <= NF && $i !~ /\]$/) i++; i++ }
        check($i)
        next
      }
      /^[[:space:]]*$/ { stanza_end(); next }
      tolower($1) == "types:" { $1 = ""; types = $0; next }
      tolower($1) == "uris:" { $1 = ""; uris = $0; next }
      tolower($1) == "enabled:" { enabled = $2; next }
      END { if (deb822 == 1) stanza_end() }
    ' "$f")
    if [[ -n $uri ]]; then
      echo "$uri"
      return 0
    fi
  done
  return 1
}
