// Command exprcheck evaluates Argo Rollouts / Flagger-style conditions with github.com/expr-lang/expr, the
// expression language Argo Rollouts evaluates successCondition and failureCondition with. It reads a JSON list
// of {"expr": "...", "result": <the measurement>} from stdin and prints a JSON list of booleans (or an error).
package main

import (
	"encoding/json"
	"fmt"
	"os"

	"github.com/expr-lang/expr"
)

type check struct {
	Expr   string `json:"expr"`
	Result any    `json:"result"`
}

func main() {
	var checks []check
	if err := json.NewDecoder(os.Stdin).Decode(&checks); err != nil {
		fmt.Fprintln(os.Stderr, "exprcheck: reading checks:", err)
		os.Exit(2)
	}
	out := make([]any, len(checks))
	for i, c := range checks {
		env := map[string]any{"result": c.Result}
		program, err := expr.Compile(c.Expr, expr.Env(env), expr.AsBool())
		if err != nil {
			out[i] = map[string]string{"error": err.Error()}
			continue
		}
		value, err := expr.Run(program, env)
		if err != nil {
			out[i] = map[string]string{"error": err.Error()}
			continue
		}
		out[i] = value
	}
	if err := json.NewEncoder(os.Stdout).Encode(out); err != nil {
		os.Exit(2)
	}
}
