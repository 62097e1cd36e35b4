; Backpack's per-user Windows installer (NSIS 3, makensis). Built by packaging/windows/build.sh:
;   makensis -DVERSION=x.y.z -DEXE=path\to\backpack.exe -DOUT=path\to\installer.exe backpack.nsi
; Installs into the user's local programs folder without administrator rights, adds a
; Start-menu entry and an uninstaller. The uninstaller removes the program and keeps the
; user's models, chats and images (%APPDATA%\backpack) unless its "Remove my models, chats and
; images" component is ticked, or /REMOVEDATA is given on a silent run.

Unicode true
; A 64-bit installer, like the program it installs (and what a 64-bit-only Wine runs).
Target amd64-unicode
!include "MUI2.nsh"
!include "FileFunc.nsh"

!ifndef VERSION
  !error "VERSION is not defined (makensis -DVERSION=...)"
!endif
!ifndef EXE
  !error "EXE is not defined (makensis -DEXE=...)"
!endif
!ifndef OUT
  !define OUT "backpack-${VERSION}-setup.exe"
!endif

!define UNINSTALL_KEY "Software\Microsoft\Windows\CurrentVersion\Uninstall\Backpack"

Name "Backpack"
OutFile "${OUT}"
InstallDir "$LOCALAPPDATA\Programs\Backpack"
InstallDirRegKey HKCU "Software\Backpack" "InstallDir"
RequestExecutionLevel user
SetCompressor /SOLID lzma
BrandingText "Backpack ${VERSION}"

VIProductVersion "${VERSION}.0"
VIAddVersionKey "ProductName" "Backpack"
VIAddVersionKey "FileDescription" "Backpack installer"
VIAddVersionKey "FileVersion" "${VERSION}"
VIAddVersionKey "ProductVersion" "${VERSION}"
VIAddVersionKey "LegalCopyright" "Backpack developers"

!define MUI_ICON "..\..\assets\icons\backpack.ico"
!define MUI_UNICON "..\..\assets\icons\backpack.ico"
!define MUI_FINISHPAGE_RUN "$INSTDIR\backpack.exe"
!insertmacro MUI_PAGE_DIRECTORY
!insertmacro MUI_PAGE_INSTFILES
!insertmacro MUI_PAGE_FINISH
!insertmacro MUI_UNPAGE_CONFIRM
!insertmacro MUI_UNPAGE_COMPONENTS
!insertmacro MUI_UNPAGE_INSTFILES
!insertmacro MUI_LANGUAGE "English"

Section "Backpack" SecMain
  SectionIn RO
  SetShellVarContext current
  SetOutPath "$INSTDIR"
  File "/oname=backpack.exe" "${EXE}"
  File "/oname=backpack.ico" "..\..\assets\icons\backpack.ico"
  WriteUninstaller "$INSTDIR\uninstall.exe"
  CreateShortcut "$SMPROGRAMS\Backpack.lnk" "$INSTDIR\backpack.exe" "" "$INSTDIR\backpack.ico"
  WriteRegStr HKCU "Software\Backpack" "InstallDir" "$INSTDIR"
  WriteRegStr HKCU "${UNINSTALL_KEY}" "DisplayName" "Backpack"
  WriteRegStr HKCU "${UNINSTALL_KEY}" "DisplayVersion" "${VERSION}"
  WriteRegStr HKCU "${UNINSTALL_KEY}" "Publisher" "Backpack developers"
  WriteRegStr HKCU "${UNINSTALL_KEY}" "DisplayIcon" "$INSTDIR\backpack.ico"
  WriteRegStr HKCU "${UNINSTALL_KEY}" "InstallLocation" "$INSTDIR"
  WriteRegStr HKCU "${UNINSTALL_KEY}" "UninstallString" '"$INSTDIR\uninstall.exe"'
  WriteRegStr HKCU "${UNINSTALL_KEY}" "QuietUninstallString" '"$INSTDIR\uninstall.exe" /S'
  WriteRegDWORD HKCU "${UNINSTALL_KEY}" "NoModify" 1
  WriteRegDWORD HKCU "${UNINSTALL_KEY}" "NoRepair" 1
SectionEnd

Section "un.Backpack" UnSecMain
  SectionIn RO
  SetShellVarContext current
  Delete "$SMPROGRAMS\Backpack.lnk"
  Delete "$INSTDIR\backpack.exe"
  Delete "$INSTDIR\backpack.ico"
  Delete "$INSTDIR\uninstall.exe"
  RMDir "$INSTDIR"
  DeleteRegKey HKCU "${UNINSTALL_KEY}"
  DeleteRegKey HKCU "Software\Backpack"
SectionEnd

; Unticked by default: the user's data stays.
Section /o "un.Remove my models, chats and images" UnSecData
  SetShellVarContext current
  RMDir /r "$APPDATA\backpack"
SectionEnd

Function un.onInit
  ; A silent uninstall keeps the data unless /REMOVEDATA is given.
  ${GetParameters} $R0
  ClearErrors
  ${GetOptions} $R0 "/REMOVEDATA" $R1
  IfErrors done
    SectionSetFlags ${UnSecData} ${SF_SELECTED}
  done:
FunctionEnd
