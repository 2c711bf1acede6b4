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
		args := []string{"-c", "gpg.format=ssh", "-c", "user.signingKey=" + k.File, "-c", "gpg.ssh.program=ssh-keygen",
			"commit-tree", cm.tree}
		for _, p := range cm.parents {
			if s, ok := signed[p]; ok {
				p = s
			}
			args = append(args, "-p", p)
		}
		args = append(args, "-S", "-F", "-")
		env := append(identityEnv("AUTHOR", cm.author), identityEnv("COMMITTER", cm.committer)...)
		out, err := g.RunEnv(ctx, env, cm.message, args...)
		if err != nil {
			return "", 0, fmt.Errorf("sign %s: commit %s with key %s: %w", branch, c, k.Fingerprint, err)
		}
		signed[c] = strings.TrimSpace(string(out))
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

// commit is what signBranch keeps of a commit object.
type commit struct {
	tree              string
	parents           []string
	author, committer string // "Name <email> 1700000000 +0100"
	message           []byte
}

// parseCommit reads a commit object: its headers (a signature it carried is dropped, an encoding
// or other header refused: the copy would not be the same commit), then its message.
func parseCommit(raw []byte) (commit, error) {
	var c commit
	head, msg, ok := bytes.Cut(raw, []byte("\n\n"))
	if !ok {
		head, msg = bytes.TrimSuffix(raw, []byte("\n")), nil
	}
	c.message = msg
	lines := strings.Split(string(head), "\n")
	for i := 0; i < len(lines); i++ {
		key, val, _ := strings.Cut(lines[i], " ")
		switch key {
		case "tree":
			c.tree = val
		case "parent":
			c.parents = append(c.parents, val)
		case "author":
			c.author = val
		case "committer":
			c.committer = val
		case "gpgsig", "gpgsig-sha256":
			for i+1 < len(lines) && strings.HasPrefix(lines[i+1], " ") { // its continuation lines
				i++
			}
		default:
			return c, fmt.Errorf("header %q cannot be carried into a signed copy", key)
		}
	}
	if c.tree == "" || c.author == "" || c.committer == "" {
		return c, errors.New("no tree, author or committer")
	}
	return c, nil
}

// identityEnv is the GIT_<ROLE>_NAME, _EMAIL and _DATE of an author or committer line.
func identityEnv(role, line string) []string {
	name, rest, _ := strings.Cut(line, " <")
	email, date, _ := strings.Cut(rest, "> ")
	return []string{"GIT_" + role + "_NAME=" + name, "GIT_" + role + "_EMAIL=" + email, "GIT_" + role + "_DATE=" + date}
}
