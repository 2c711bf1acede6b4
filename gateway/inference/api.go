package inference

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"slices"
	"strings"

	"github.com/labstack/echo/v4"

	"github.com/openclaw/cloudworkers/gateway/credentials"
	"github.com/openclaw/cloudworkers/gateway/paging"
	"github.com/openclaw/cloudworkers/internal/jsonbody"
	"github.com/openclaw/cloudworkers/providers"
)

// CredentialSetRequest is the body of PUT /credentials/:name. The value is write-only.
type CredentialSetRequest struct {
	Value string `json:"value"`
}

// ProbeRequest is the (optional) body of POST /models/probe: the model to call, "" for the default.
type ProbeRequest struct {
	Model string `json:"model,omitempty"`
}

// CredentialInfo is what the API says about a credential: its name and whether the catalog uses it.
type CredentialInfo struct {
	Name string `json:"name"`
	// UsedBy lists the providers of the catalog that name this credential.
	UsedBy []string `json:"usedBy,omitempty"`
}

// ModelsResponse is the body of GET /models.
type ModelsResponse struct {
	Default string  `json:"default"`
	Models  []Model `json:"models"`
}

// RegisterAPI adds GET /models, POST /models/probe (one minimal real call, see Catalog.Probe) and
// the write-only credential routes to g (the authenticated
// /api/v1 group). Credential values are accepted, never returned; errors name the field only.
func RegisterAPI(g *echo.Group, cat *Catalog, creds *credentials.Store) {
	g.GET("/models", func(c echo.Context) error {
		return c.JSON(http.StatusOK, ModelsResponse{Default: cat.Default(), Models: cat.Models()})
	})
	g.POST("/models/probe", func(c echo.Context) error {
		var req ProbeRequest
		if c.Request().ContentLength != 0 {
			b, err := io.ReadAll(c.Request().Body)
			if err != nil {
				return err
			}
			if err := decodeStrict(b, &req); err != nil {
				return providers.Fieldf("body", "must be {\"model\": \"provider/model\"} or empty")
			}
		}
		p, err := cat.Probe(c.Request().Context(), req.Model)
		if errors.Is(err, ErrModelNotApproved) {
			return providers.Fieldf("model", "%v", err)
		}
		if err != nil {
			return err
		}
		return c.JSON(http.StatusOK, p)
	})
	g.GET("/credentials", func(c echo.Context) error {
		names, err := creds.List(c.Request().Context())
		if err != nil {
			return err
		}
		usedBy := map[string][]string{}
		for _, m := range cat.Models() {
			if m.Credential != "" && !slices.Contains(usedBy[m.Credential], m.Provider) {
				usedBy[m.Credential] = append(usedBy[m.Credential], m.Provider)
			}
		}
		out := make([]CredentialInfo, 0, len(names))
		for _, n := range names {
			out = append(out, CredentialInfo{Name: n, UsedBy: usedBy[n]})
		}
		out, err = paging.Page(c.Request(), c.Response().Header(), out,
			func(ci CredentialInfo) paging.Key { return paging.Key{ID: ci.Name} }, paging.Ascending)
		if err != nil {
			return err
		}
		return c.JSON(http.StatusOK, out)
	})
	g.PUT("/credentials/:name", func(c echo.Context) error {
		name := c.Param("name")
		var req CredentialSetRequest
		// Decoded by hand: a JSON error from the standard binder could quote the body.
		b, err := io.ReadAll(io.LimitReader(c.Request().Body, credentials.MaxValueBytes*2+1024))
		if err != nil {
			var mbe *http.MaxBytesError
			if errors.As(err, &mbe) {
				return err
			}
			return providers.Fieldf("value", "cannot read request body")
		}
		if err := jsonbody.Decode(bytes.NewReader(b), &req); err != nil {
			// jsonbody names the field; its other messages could quote a byte of the secret
			var fe *providers.FieldError
			switch {
			case errors.As(err, &fe) && fe.Field == "value":
				return providers.Fieldf("value", "must be a string")
			case errors.As(err, &fe) && fe.Field != "body":
				return err // an unknown field, named
			}
			return providers.Fieldf("body", "must be {\"value\": \"...\"} (nothing of the body is quoted here: it may hold the secret)")
		}
		req.Value = strings.TrimRight(req.Value, "\r\n")
		if err := creds.Set(c.Request().Context(), name, req.Value); err != nil {
			return err
		}
		return c.JSON(http.StatusOK, CredentialInfo{Name: name})
	})
	g.DELETE("/credentials/:name", func(c echo.Context) error {
		name := c.Param("name")
		if err := creds.Delete(c.Request().Context(), name); err != nil {
			return err
		}
		return c.NoContent(http.StatusNoContent)
	})
}

func decodeStrict(b []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if dec.More() {
		return errors.New("trailing data")
	}
	return nil
}
