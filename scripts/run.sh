#!/usr/bin/env bash
# Runs QEMU for `make run` with the appliance's console on this terminal, and stops it
# the way `virsh shutdown` would: Ctrl-C (SIGINT, or SIGTERM/SIGHUP to this script)
# presses the machine's ACPI power button through QMP (`system_powerdown` on
# 127.0.0.1:QMP_PORT), and the appliance closes its clients, unmounts cleanly and powers
# off. If QEMU has not exited STOP_TIMEOUT seconds later, or on a second Ctrl-C, it is
# killed (what was fsynced is safe in the log either way). Ctrl-A X still quits QEMU at
# once, Ctrl-A C still switches to its monitor.
#
# The appliance's structured events (its second serial port, COM2) go to the file EVENTS,
# not to this terminal: the console is for people (`tail -f EVENTS` to watch them).
#
# Usage: scripts/run.sh QEMU [ARGS...]   (QEMU's serial and console arguments are added
# here: the console must be the first serial port)
# Environment: QMP_PORT (default 5642), STOP_TIMEOUT (seconds, default 45), EVENTS (default
# build/events.log).
set -uo pipefail

qmp_port=${QMP_PORT:-5642}
stop_timeout=${STOP_TIMEOUT:-45}
events=${EVENTS:-build/events.log}
mkdir -p "$(dirname "$events")"
: >"$events"
tty_state=$(stty -g 2>/dev/null) || tty_state=

say() { printf '\r\nrun: %s\r\n' "$*" >&2; }

# The console multiplexes the serial port and QEMU's monitor on this terminal, as
# `-serial mon:stdio` does, but with signal=on: Ctrl-C is a signal, not a byte for the
# guest. QEMU runs in a session of its own, so that signal reaches this script, not QEMU
# (which would quit at once).
setsid "$@" \
    -chardev stdio,id=console,mux=on,signal=on \
    -serial chardev:console -mon chardev=console,mode=readline \
    -serial "file:$events" \
    -qmp "tcp:127.0.0.1:$qmp_port,server=on,wait=off" <&0 &
qemu=$!

# Presses the power button: QMP greeting, capabilities negotiation, system_powerdown.
power_button() {
    local reply
    exec 3<>"/dev/tcp/127.0.0.1/$qmp_port" || return 1
    read -r -t 5 reply <&3 || return 1
    printf '{"execute":"qmp_capabilities"}\n{"execute":"system_powerdown"}\n' >&3
    # Both commands answer `return`; QEMU's POWERDOWN event may come in between.
    local returns=0
    for _ in 1 2 3 4; do
        read -r -t 5 reply <&3 || break
        [[ $reply == *'"return"'* ]] && ((++returns == 2)) && break
    done
    exec 3>&-
    ((returns == 2))
}

pressed=0
watchdog=
stop() {
    if ((pressed)); then
        say "stopping now: killing QEMU"
        kill -KILL "$qemu" 2>/dev/null
        return
    fi
    pressed=1
    if power_button; then
        say "power button pressed: the appliance shuts down cleanly (up to ${stop_timeout} s; Ctrl-C again to kill it now)"
        (sleep "$stop_timeout" && kill -KILL "$qemu" 2>/dev/null &&
            say "no power-off after ${stop_timeout} s: QEMU killed") &
        watchdog=$!
    else
        say "cannot reach QEMU's QMP port $qmp_port: killing QEMU"
        kill -KILL "$qemu" 2>/dev/null
    fi
}
trap stop INT TERM HUP

# `wait` returns early whenever a trapped signal arrives; keep waiting until QEMU is gone.
while kill -0 "$qemu" 2>/dev/null; do
    wait "$qemu"
done
wait "$qemu"
status=$?
[[ -n $watchdog ]] && kill "$watchdog" 2>/dev/null
[[ -n $tty_state ]] && stty "$tty_state" 2>/dev/null
if ((pressed)) && ((status == 0)); then
    say "the appliance powered off"
fi
exit "$status"
