// Package local provides the built-in development machine: a detached SSH server process rooted in
// a directory (the "local box", started as `openclaw localbox`) and the provider that leases such boxes.
//
// A box is a process, not a machine image. When its process is dead (killed, or the host rebooted)
// the box is reported Gone: nothing of the machine is running any more, and what is left on disk is
// only its directory, which Destroy removes. Liveness is proved by an advisory lock the box process
// holds on <box>/.localbox/lock for its whole life, so a recycled pid is never mistaken for a box.
//
// Layout of a box directory (it is also the box user's HOME and the working directory of every command):
//
//	<boxes>/<lease-id>/
//	  .localbox/state.json            pid, port, host key, client key path, labels (written by the box)
//	  .localbox/lock                  held by the live box process; contains its pid
//	  .localbox/ssh_host_ed25519_key  host key (0600), reused when the box is restarted
//	  .localbox/client_ed25519        client private key (0600) the gateway logs in with
//	  .localbox/client_ed25519.pub    the only authorized key
//	  .localbox/box.log               stdout and stderr of the box process
//
// Commands run by the box get a clean environment and their own process group; commands that detach
// themselves (setsid, nohup … &) outlive the exec channel, as they do under OpenSSH.
package local
