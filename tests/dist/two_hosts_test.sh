#!/bin/sh
# Two "hosts" on this machine: two network namespaces joined by a veth pair, one rank in each, talking TCP
# over the pair (mpirun starts the second rank through an rsh agent that enters the other namespace, as ssh
# would reach another machine). The image must be the one a single process draws.
#   two_hosts_test.sh KILN MODEL_DIR WORK_DIR
# Exits 77 (skipped) without root or network namespaces.
set -u
kiln=$1 model=$2 work=$3
[ "$(id -u)" -eq 0 ] || { echo "skipped: needs root for network namespaces"; exit 77; }
ns_a=kiln_tp_a_$$ ns_b=kiln_tp_b_$$
cleanup() { ip netns del "$ns_a" 2>/dev/null; ip netns del "$ns_b" 2>/dev/null; }
trap cleanup EXIT
ip netns add "$ns_a" 2>/dev/null && ip netns add "$ns_b" || { echo "skipped: cannot make network namespaces"; exit 77; }
ip link add va$$ netns "$ns_a" type veth peer name vb$$ netns "$ns_b" || exit 1
ip -n "$ns_a" addr add 10.231.0.1/24 dev va$$ && ip -n "$ns_b" addr add 10.231.0.2/24 dev vb$$ || exit 1
for ns in "$ns_a" "$ns_b"; do ip -n "$ns" link set lo up; done
ip -n "$ns_a" link set va$$ up && ip -n "$ns_b" link set vb$$ up || exit 1

rm -rf "$work" && mkdir -p "$work"
# mpirun's "remote shell": the first argument is the host, the rest the command to run there.
agent="$work/netns_rsh"
cat > "$agent" <<AGENT
#!/bin/sh
host=\$1; shift
case "\$host" in
  10.231.0.2) exec ip netns exec $ns_b sh -c "\$*" ;;
  *) exec sh -c "\$*" ;;
esac
AGENT
chmod +x "$agent"

args="generate --prompt 'a red circle' --height 32 --width 32 --steps 2 --seed 1 --dtype f32 --max-sequence-length 16 --model $model"
sh -c "$kiln $args --output $work/one.png" > "$work/one.log" 2>&1 || { cat "$work/one.log"; exit 1; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
timeout 120 ip netns exec "$ns_a" mpirun -np 2 --host 10.231.0.1:1,10.231.0.2:1 \
  --mca plm_rsh_agent "$agent" --mca oob_tcp_if_include 10.231.0.0/24 \
  --mca btl tcp,self --mca btl_tcp_if_include 10.231.0.0/24 --mca pml ob1 \
  sh -c "echo rank \$OMPI_COMM_WORLD_RANK in netns \$(ip netns identify \$\$); exec $kiln $args --tp 2 --output $work/two.png" \
  > "$work/two.log" 2>&1
status=$?
cat "$work/two.log"
[ "$status" -eq 0 ] || { echo "FAIL: mpirun over the veth pair exited $status"; exit 1; }
grep -q "rank 1 in netns $ns_b" "$work/two.log" || { echo "FAIL: rank 1 did not run in $ns_b"; exit 1; }
cmp "$work/one.png" "$work/two.png" || { echo "FAIL: the two-host image differs from one process's"; exit 1; }
echo "PASS: two ranks in two network namespaces over TCP drew the one-process image"
