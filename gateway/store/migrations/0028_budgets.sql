-- Budgets set at run time (openclaw budget set, PUT /api/v1/budgets/{id}); the config's budgets
-- are not stored: a budget id is in one place or the other.
CREATE TABLE budgets (
	id          TEXT PRIMARY KEY,
	budget      TEXT NOT NULL,  -- the spend.Budget, as JSON
	updated_at  TEXT NOT NULL
);
