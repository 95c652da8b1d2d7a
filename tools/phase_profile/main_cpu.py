"""CPU ms Envoy's main thread (its thread id is the process id) has used so far."""
import os, sys

pid = sys.argv[1]
stat = open(f"/proc/{pid}/task/{pid}/stat").read()
fields = stat[stat.rindex(")") + 2:].split()  # from the state on: utime and stime are 12th, 13th
print((int(fields[11]) + int(fields[12])) * 1000 / os.sysconf("SC_CLK_TCK"))
