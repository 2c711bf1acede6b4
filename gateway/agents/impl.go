package agents

import "context"

func (s *Spawner) spawn(ctx context.Context, parentID string, req SpawnRequest) (SpawnResult, error) {
	return SpawnResult{}, ErrNotStarted
}
func (s *Spawner) send(ctx context.Context, parentID, childID, message string, wait bool) (SpawnResult, error) {
	return SpawnResult{}, ErrNotStarted
}
func (s *Spawner) status(ctx context.Context, parentID, childID string) (SpawnResult, error) {
	return SpawnResult{}, ErrNotStarted
}
func (s *Spawner) pullback(ctx context.Context, parentID, childID string) (SpawnResult, error) {
	return SpawnResult{}, ErrNotStarted
}
func (s *Spawner) children(ctx context.Context, parentID string) ([]Child, error) {
	return nil, ErrNotStarted
}
