# Source this: starts a throwaway PostgreSQL server on loopback for the distributed-sweep test
# and exports DSPARK_TEST_POSTGRES_URL. Installs Debian's postgresql if it is missing.
# On any failure it says why and leaves the variable unset (the test then skips, visibly).
start_postgres() {
    local bin dir port
    # A free port, so that a server left over from another run does not get in the way.
    port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    if ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
        (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null) \
            || { echo "postgres: could not install Debian's postgresql"; return 1; }
    fi
    bin=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -n 1)
    dir=$(mktemp -d /tmp/dspark-pg.XXXXXX)
    chown postgres "$dir" 2>/dev/null || true
    # The server refuses to run as root: run it as the postgres user when we are root.
    local as=()
    [ "$(id -u)" = 0 ] && as=(runuser -u postgres --)
    "${as[@]}" "$bin/initdb" -D "$dir/data" -A trust -U postgres >/dev/null \
        || { echo "postgres: initdb failed"; return 1; }
    "${as[@]}" "$bin/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w \
        -o "-p $port -k $dir -c listen_addresses=127.0.0.1" start >/dev/null \
        || { echo "postgres: server did not start (see $dir/server.log)"; return 1; }
    "$bin/createdb" -h 127.0.0.1 -p "$port" -U postgres dspark || { echo "postgres: createdb failed"; return 1; }
    export DSPARK_TEST_POSTGRES_URL="postgresql+psycopg2://postgres@127.0.0.1:$port/dspark"
    echo "postgres: running on 127.0.0.1:$port ($dir)"
}
start_postgres || true
