package tests

import (
	"debug/elf"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// imageUID is the user and group of distroless's nonroot image, which the
// Dockerfile runs as and the chart's securityContext names.
const imageUID = 65532

// dockerfileStage is what the chart relies on in the Dockerfile's final
// stage.
type dockerfileStage struct {
	from       string
	user       string
	env        map[string]string
	expose     []string
	entrypoint []string
	cmd        []string
}

// parseDockerfile reads the instructions of the Dockerfile's last stage and
// the build stage's go build command line.
func parseDockerfile(t *testing.T) (final dockerfileStage, goBuild string) {
	t.Helper()
	raw, err := os.ReadFile("../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	// Join continuation lines, drop comments.
	text := regexp.MustCompile(`\\\n`).ReplaceAllString(string(raw), " ")
	for line := range strings.SplitSeq(text, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		instr, args, _ := strings.Cut(line, " ")
		args = strings.TrimSpace(args)
		switch strings.ToUpper(instr) {
		case "FROM":
			fields := strings.Fields(args)
			for len(fields) > 0 && strings.HasPrefix(fields[0], "--") {
				fields = fields[1:]
			}
			final = dockerfileStage{from: fields[0], env: map[string]string{}}
		case "USER":
			final.user = args
		case "ENV":
			k, v, _ := strings.Cut(args, "=")
			final.env[k] = v
		case "EXPOSE":
			final.expose = strings.Fields(args)
		case "ENTRYPOINT":
			final.entrypoint = execForm(t, args)
		case "CMD":
			final.cmd = execForm(t, args)
		case "RUN":
			if m := regexp.MustCompile(`CGO_ENABLED=0 .*go build [^&]*`).FindString(args); m != "" {
				goBuild = strings.TrimSpace(m)
			}
		}
	}
	return final, goBuild
}

func execForm(t *testing.T, args string) []string {
	t.Helper()
	var v []string
	if err := json.Unmarshal([]byte(args), &v); err != nil {
		t.Fatalf("%s: want the exec (JSON) form: %v", args, err)
	}
	return v
}

// TestChartMatchesDockerfile checks that the chart's defaults agree with
// the image: user and group, data directory, port, and the command.
func TestChartMatchesDockerfile(t *testing.T) {
	img, goBuild := parseDockerfile(t)
	if !strings.HasPrefix(img.from, "gcr.io/distroless/static-debian12:nonroot") {
		t.Errorf("final stage FROM %s, want distroless static nonroot", img.from)
	}
	uid := strconv.Itoa(imageUID)
	if img.user != uid+":"+uid {
		t.Errorf("USER %q, want %s:%s", img.user, uid, uid)
	}
	if !slices.Equal(img.entrypoint, []string{"/kdedup"}) || !slices.Equal(img.cmd, []string{"run"}) {
		t.Errorf("ENTRYPOINT %v CMD %v, want [/kdedup] [run]", img.entrypoint, img.cmd)
	}
	if goBuild == "" || !strings.Contains(goBuild, "-trimpath") || !strings.Contains(goBuild, "./cmd/kdedup") {
		t.Errorf("build stage runs %q, want CGO_ENABLED=0 go build -trimpath ... ./cmd/kdedup", goBuild)
	}

	raw, err := os.ReadFile(filepath.Join(chartDir, "values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var values struct {
		PodSecurityContext struct{ RunAsUser, RunAsGroup, FSGroup int } `json:"podSecurityContext"`
		SecurityContext    struct{ RunAsUser, RunAsGroup int }          `json:"securityContext"`
		Persistence        struct{ MountPath string }                   `json:"persistence"`
		HTTP               struct{ Port int }                           `json:"http"`
	}
	if err := yaml.Unmarshal(raw, &values); err != nil {
		t.Fatal(err)
	}
	for name, id := range map[string]int{
		"podSecurityContext.runAsUser": values.PodSecurityContext.RunAsUser, "podSecurityContext.runAsGroup": values.PodSecurityContext.RunAsGroup,
		"podSecurityContext.fsGroup": values.PodSecurityContext.FSGroup,
		"securityContext.runAsUser":  values.SecurityContext.RunAsUser, "securityContext.runAsGroup": values.SecurityContext.RunAsGroup,
	} {
		if id != imageUID {
			t.Errorf("values %s = %d, want the image's %d", name, id, imageUID)
		}
	}
	if got := img.env["KDEDUP_DATA_DIR"]; got != values.Persistence.MountPath {
		t.Errorf("image KDEDUP_DATA_DIR %q, chart persistence.mountPath %q", got, values.Persistence.MountPath)
	}
	if !slices.Contains(img.expose, strconv.Itoa(values.HTTP.Port)) {
		t.Errorf("image EXPOSE %v, chart http.port %d", img.expose, values.HTTP.Port)
	}

	// The rendered container runs the image's command.
	out, err := helmTemplate(t, []string{ciFile("default-values.yaml")})
	if err != nil {
		t.Fatal(err)
	}
	c := workerContainer(t, decodeStrict(t, out))
	if len(c.Command) > 0 || !slices.Equal(c.Args, img.cmd) {
		t.Errorf("container command %v args %v, want the image's entrypoint and args %v", c.Command, c.Args, img.cmd)
	}
}

// TestChartImageBinaryIsStatic runs the Dockerfile's go build and checks
// that the binary needs no dynamic loader nor shared library, as
// distroless/static requires.
func TestChartImageBinaryIsStatic(t *testing.T) {
	_, goBuild := parseDockerfile(t)
	bin := filepath.Join(t.TempDir(), "kdedup")
	cmd := exec.Command("go", "build", "-trimpath", "-ldflags", "-s -w", "-o", bin, "./cmd/kdedup")
	cmd.Dir = ".."
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", goBuild, err, out)
	}
	f, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP || p.Type == elf.PT_DYNAMIC {
			t.Errorf("binary has a %v program header: dynamically linked", p.Type)
		}
	}
	if libs, _ := f.ImportedLibraries(); len(libs) > 0 {
		t.Errorf("binary needs shared libraries %v", libs)
	}
}
