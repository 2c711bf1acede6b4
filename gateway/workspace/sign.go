package workspace

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"strings"

	"golang.org/x/crypto/ssh"

	"github.com/openclaw/cloudworkers/sync/gitexec"
	"github.com/openclaw/cloudworkers/sync/gitsync"
)

// MaxSignedCommits bounds the commits one publish re-signs.
const MaxSignedCommits = 5000

// SignedRefPrefix holds the signed copy of each managed branch: refs/openclaw/signed/<name>.
const SignedRefPrefix = "refs/openclaw/signed/"

// SigningKey is the gateway-held SSH key that re-signs a session's adopted commits before they
// are published (git.signing.key). It never leaves the gateway: the box's commits are signed here,
// after they came back.
type SigningKey struct {
	// File is the private key's path (an OpenSSH key without a passphrase, mode 0600).
	File string
	// Fingerprint is the public key's SHA256 fingerprint, for notes and errors.
	Fingerprint string
	// Public is the public key in authorized_keys form (what a forge takes as a signing key).
	Public string
}

// LoadSigningKey checks the key file before the gateway starts: readable, private to its owner,
// an SSH private key without a passphrase.
func LoadSigningKey(file string) (*SigningKey, error) {
	st, err := os.Stat(file)
	if err != nil {
		return nil, fmt.Errorf("git.signing.key: %w", err)
	}
	if st.Mode().Perm()&0o077 != 0 {
		return nil, fmt.Errorf("git.signing.key: %s is readable by others (mode %#o); chmod 600 it", file, st.Mode().Perm())
	}
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("git.signing.key: %w", err)
	}
	signer, err := ssh.ParsePrivateKey(b)
	var missing *ssh.PassphraseMissingError
	switch {
	case errors.As(err, &missing):
		return nil, fmt.Errorf("git.signing.key: %s has a passphrase; the gateway signs unattended, so it needs a key without one", file)
	case err != nil:
		return nil, fmt.Errorf("git.signing.key: %s is not an OpenSSH private key: %v", file, err)
	}
	pub := signer.PublicKey()
	switch pub.Type() {
	case ssh.KeyAlgoED25519, ssh.KeyAlgoRSA:
	default:
		// an ECDSA signature differs every time: each publish would rewrite every commit
		return nil, fmt.Errorf("git.signing.key: %s is a %s key; use an Ed25519 or RSA key, whose signatures are the same bytes every time", file, pub.Type())
	}
	return &SigningKey{File: file, Fingerprint: ssh.FingerprintSHA256(pub),
		Public: strings.TrimSpace(string(ssh.MarshalAuthorizedKey(pub)))}, nil
}

// signBranch writes the signed copy of a managed branch: each commit the session added (those on
// no other branch or tag, as Changes lists them), oldest first, committed again with the same
// tree, parents (their signed copies), author, committer, dates and message, and an SSH signature
// made here. SSH signatures of a given key and payload are the same bytes every time, so signing
// again what was signed before gives the same commits: a later publish fast-forwards. It returns
// the signed ref and how many commits it signed.
func (k *SigningKey) signBranch(ctx context.Context, g *gitexec.Untrusted, branch string) (string, int, error) {
	ref := "refs/heads/" + branch
	revs, err := g.Run(ctx, "rev-list", "--reverse", "--topo-order", "-n", itoa(MaxSignedCommits+1), ref,
		"--not", "--exclude="+gitsync.BranchPrefix+"*", "--branches", "--tags", "--glob="+gitsync.SnapshotRefPrefix+"*")
	if err != nil {
		return "", 0, fmt.Errorf("sign %s: list its commits: %w", branch, err)
	}
	list := strings.Fields(string(revs))
	if len(list) > MaxSignedCommits {
		return "", 0, fmt.Errorf("sign %s: it adds more than %d commits; publish fewer at a time", branch, MaxSignedCommits)
	}
	signed := map[string]string{}
	tip, err := g.Line(ctx, "rev-parse", "--verify", ref+"^{commit}")
	if err != nil {
		return "", 0, err
	}
	for _, c := range list {
		raw, err := g.Run(ctx, "cat-file", "commit", c)
		if err != nil {
			return "", 0, fmt.Errorf("sign %s: read commit %s: %w", branch, c, err)
		}
		cm, err := parseCommit(raw)
		if err != nil {
			return "", 0, fmt.Errorf("sign %s: commit %s: %w", branch, c, err)
		}
		args := []string{"-c", "gpg.format=ssh", "-c", "user.signingKey=" + k.File, "-c", "gpg.ssh.program=ssh-keygen", "commit-tree"}
		for _, p := range mapped(cm.parents, signed) {
			args = append(args, "-p", p)
		}
		args = append(args, "-S", "-F", "-", cm.tree) // ids checked by parseCommit: no option among them
		env := append(identityEnv("AUTHOR", cm.author), identityEnv("COMMITTER", cm.committer)...)
		out, err := g.RunEnv(ctx, env, cm.message, args...)
		if err != nil {
			return "", 0, fmt.Errorf("sign %s: commit %s with key %s: %w", branch, c, k.Fingerprint, err)
		}
		copyID := strings.TrimSpace(string(out))
		// The copy must be the worker's commit but for its signature (git normalizes some
		// identities, and refuses some dates): otherwise it is refused, never published changed.
		rawCopy, err := g.Run(ctx, "cat-file", "commit", copyID)
		if err != nil {
			return "", 0, fmt.Errorf("sign %s: read the signed copy of %s: %w", branch, c, err)
		}
		cp, err := parseCommit(rawCopy)
		if err != nil || cp.tree != cm.tree || cp.author != cm.author || cp.committer != cm.committer ||
			!bytes.Equal(cp.message, cm.message) || strings.Join(cp.parents, " ") != strings.Join(mapped(cm.parents, signed), " ") {
			return "", 0, fmt.Errorf("sign %s: commit %s cannot be signed as it is (its author, committer, date or message would change); publish without git.signing, or rewrite it", branch, c)
		}
		signed[c] = copyID
	}
	head := tip
	if s, ok := signed[tip]; ok {
		head = s
	}
	out := SignedRefPrefix + strings.TrimPrefix(branch, gitsync.BranchPrefix)
	if _, err := g.Run(ctx, "update-ref", out, head); err != nil {
		return "", 0, fmt.Errorf("sign %s: %w", branch, err)
	}
	return out, len(list), nil
}

// mapped replaces each parent that was signed by its signed copy.
func mapped(parents []string, signed map[string]string) []string {
	out := make([]string, len(parents))
	for i, p := range parents {
		out[i] = p
		if s, ok := signed[p]; ok {
			out[i] = s
		}
	}
	return out
}

// commit is what signBranch keeps of a commit object.
type commit struct {
	tree              string
	parents           []string
	author, committer string // "Name <email> 1700000000 +0100"
	message           []byte
}

// parseCommit reads a commit object strictly, in git's own order: one tree (the first line), the
// parents right after it, one author, one committer, then at most a signature it carried (dropped)
// and the message. Anything else (a repeated or later header, an encoding, a mergetag) is refused:
// git reads only the first tree and the parents after it, so a looser reading would sign other
// content than the checks at the pull-back saw.
func parseCommit(raw []byte) (commit, error) {
	var c commit
	head, msg, ok := bytes.Cut(raw, []byte("\n\n"))
	if !ok {
		head, msg = bytes.TrimSuffix(raw, []byte("\n")), nil
	}
	c.message = msg
	lines := strings.Split(string(head), "\n")
	i := 0
	next := func(key string) (string, bool) {
		if i < len(lines) {
			if v, ok := strings.CutPrefix(lines[i], key+" "); ok {
				i++
				return v, true
			}
		}
		return "", false
	}
	var ok2 bool
	if c.tree, ok2 = next("tree"); !ok2 || !objectID(c.tree) {
		return c, errors.New("its first line is not a tree id")
	}
	for {
		p, ok := next("parent")
		if !ok {
			break
		}
		if !objectID(p) {
			return c, fmt.Errorf("parent %q is not an object id", p)
		}
		c.parents = append(c.parents, p)
	}
	if c.author, ok2 = next("author"); !ok2 {
		return c, errors.New("no author after its tree and parents")
	}
	if c.committer, ok2 = next("committer"); !ok2 {
		return c, errors.New("no committer after its author")
	}
	if i < len(lines) && (strings.HasPrefix(lines[i], "gpgsig ") || strings.HasPrefix(lines[i], "gpgsig-sha256 ")) {
		for i++; i < len(lines) && strings.HasPrefix(lines[i], " "); i++ { // its continuation lines
		}
	}
	if i < len(lines) {
		key, _, _ := strings.Cut(lines[i], " ")
		return c, fmt.Errorf("header %q cannot be carried into a signed copy", key)
	}
	return c, nil
}

// objectID reports whether s is a full SHA-1 or SHA-256 object id in lower-case hex.
func objectID(s string) bool {
	if len(s) != 40 && len(s) != 64 {
		return false
	}
	for _, r := range s {
		if !(r >= '0' && r <= '9' || r >= 'a' && r <= 'f') {
			return false
		}
	}
	return true
}

// identityEnv is the GIT_<ROLE>_NAME, _EMAIL and _DATE of an author or committer line.
func identityEnv(role, line string) []string {
	name, rest, _ := strings.Cut(line, " <")
	email, date, _ := strings.Cut(rest, "> ")
	return []string{"GIT_" + role + "_NAME=" + name, "GIT_" + role + "_EMAIL=" + email, "GIT_" + role + "_DATE=@" + date}
}
